"""A consumer's failed step is sent into its follower's channel again after 1, 2, 4 ... 30 s
and the wait starts over after a success (cowfs/fs/replica_changes.py `Retry`): a producer
with nothing new sends no other notice. Trio's mock clock: no real sleeps."""
from __future__ import annotations

import math

import trio
import trio.testing

from cowfs.fs.replica_changes import RETRY_MAX, Retry


def test_failed_steps_come_back_after_doubling_waits_reset_by_a_success():
    arrivals: list[tuple[float, object]] = []

    async def main() -> None:
        send, recv = trio.open_memory_channel[object](math.inf)
        retry = Retry(send)
        async with trio.open_nursery() as nursery:
            for n in range(7):  # seven failures in a row
                start = trio.current_time()
                nursery.start_soon(retry.later, ("store", n))
                item = await recv.receive()
                arrivals.append((trio.current_time() - start, item))
            retry.succeeded()
            start = trio.current_time()
            nursery.start_soon(retry.later, "a", "b")
            assert await recv.receive() == "a" and await recv.receive() == "b"
            arrivals.append((trio.current_time() - start, "after a success"))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert [round(t) for t, _ in arrivals] == [1, 2, 4, 8, 16, RETRY_MAX, RETRY_MAX, 1]
    assert [item for _, item in arrivals[:2]] == [("store", 0), ("store", 1)]
