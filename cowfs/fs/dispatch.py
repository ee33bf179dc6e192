"""How FUSE handlers on the trio thread hand work to threads, and how errors become errno.

Every handler is wrapped in translate_errors: an engine error becomes its errno,
anything unexpected is logged and becomes EIO (any other exception would make
pyfuse3 end the whole filesystem).
"""
from __future__ import annotations

import errno
import functools
import logging
from concurrent.futures import Future
from typing import Any, Awaitable, Callable, TypeVar

import pyfuse3
import trio

from ..errors import CowfsError

log = logging.getLogger("cowfs.fs")
T = TypeVar("T")


def translate_errors(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Engine errors become their errno; anything unexpected is logged and becomes EIO
    (any other exception would make pyfuse3 end the whole filesystem)."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except CowfsError as e:
            if e.errno == errno.EIO:
                log.error("%s: %s", fn.__name__, e)
            raise pyfuse3.FUSEError(e.errno) from None
        except OSError as e:
            log.error("%s: %s", fn.__name__, e)
            raise pyfuse3.FUSEError(e.errno or errno.EIO) from None
        except Exception:
            log.exception("unexpected error in %s", fn.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    return await trio.to_thread.run_sync(functools.partial(fn, *args))


async def wait_future(future: Future[Any]) -> None:
    """Wait in trio, without a thread, until a concurrent.futures Future is done."""
    if future.done():
        return
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()

    def wake(_f: object) -> None:
        try:
            token.run_sync_soon(done.set)
        except trio.RunFinishedError:
            pass

    future.add_done_callback(wake)
    await done.wait()
