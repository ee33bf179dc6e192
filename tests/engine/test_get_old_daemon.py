"""A get into a kept memfd asked of a daemon from before such gets (cowfs/plugins/get.py): that
daemon answers EINVAL ("a get sends no descriptor"), and the client asks again the old way,
on a new connection, and reads the sealed memfd that daemon sends; the kept memfd goes back.
The daemon is played by a thread on a socket pair, with the old daemon's replies."""
from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
from pathlib import Path

import pytest

from cowfs.plugins import get as get_module
from cowfs.plugins.part_memfds import PartMemfds

OLD_REFUSAL = ("a get sends no descriptor (it names the file open for reading through the mount by its number: "
               '{"fd": N}), not 1')


def _old_daemon(conn: socket.socket, data: bytes, asked: list[dict]) -> None:
    with conn:
        msg, fds, _flags, _addr = socket.recv_fds(conn, 4096, 4)
        header = json.loads(msg.split(b"\n", 1)[0])
        asked.append({**header, "descriptors": len(fds)})
        for fd in fds:
            os.close(fd)
        if fds:
            conn.sendall(json.dumps({"ok": False, "errno": 22, "error": OLD_REFUSAL}).encode() + b"\n")
            return
        memfd = os.memfd_create("old-get", os.MFD_ALLOW_SEALING)
        os.pwrite(memfd, data, 0)  # (the offset stays 0: the client reads from it)
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
        socket.send_fds(conn, [json.dumps({"ok": True, "result": {"size": len(data)}}).encode() + b"\n"], [memfd])
        os.close(memfd)


def _old_daemons(monkeypatch: pytest.MonkeyPatch, data: bytes) -> tuple[list[dict], list[threading.Thread]]:
    """Every connection the client makes answered by an old daemon (a thread); what each was
    asked, and the threads."""
    asked: list[dict] = []
    threads: list[threading.Thread] = []

    def connect(_fd: int) -> socket.socket:
        mine, daemons = socket.socketpair()
        threads.append(threading.Thread(target=_old_daemon, args=(daemons, data, asked)))
        threads[-1].start()
        return mine

    monkeypatch.setattr(get_module, "daemon_socket", connect)
    return asked, threads


def test_a_kept_get_asks_an_old_daemon_again_the_old_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = os.urandom(100_000)
    (tmp_path / "f").write_bytes(data)
    memfds = PartMemfds(keep=1 << 20)
    asked, threads = _old_daemons(monkeypatch, data)
    monkeypatch.setattr(get_module, "part_memfds", lambda: memfds)
    with get_module.open_read(tmp_path / "f", kept=True) as f:
        assert f.read() == data and fcntl.fcntl(f.fileno(), fcntl.F_GET_SEALS) & fcntl.F_SEAL_WRITE
    for t in threads:
        t.join()
    assert [(a["into"], a["descriptors"]) for a in asked] == [(True, 1), (False, 0)]
    assert memfds.free == 1 and memfds.owned == 100_000  # the kept memfd back, unused


def test_ranges_asked_of_an_old_daemon_read_the_whole_file_it_sends(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    data = os.urandom(300_000)
    (tmp_path / "f").write_bytes(data)
    asked, threads = _old_daemons(monkeypatch, data)
    with get_module.open_read(tmp_path / "f", ranges=[(1000, 500), (200_000, 10)]) as f:
        assert not isinstance(f, get_module._WindowedBytes)  # no "ranges" in the reply: the whole file
        f.seek(200_000)
        assert f.read(10) == data[200_000:200_010]
        f.seek(0)
        assert f.read() == data
    for t in threads:
        t.join()
    asked_ranges = [[1000, 500], [200_000, 10]]  # into a kept memfd, refused, then the old way
    assert [(a["ranges"], a["into"]) for a in asked] == [(asked_ranges, True), (asked_ranges, False)]
