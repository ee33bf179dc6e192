"""A network namespace for one daemon of a test, joined to this machine by a veth pair, so
that the test can cut it off and join it again (`ip link set ... down/up`).

The namespace reaches the engine (listening on 127.0.0.1 here) through a TCP relay this
process runs on the host's end of the pair; the host reaches the namespace's address
directly. Commands run inside with `nsenter --net` only (the mount namespace stays this
machine's, so a FUSE mount made inside is seen here). Everything it made is removed on
exit, by name: the namespace (its end of the pair goes with it) and the relay."""
from __future__ import annotations

import os
import random
import socket
import subprocess
import threading
from pathlib import Path


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class IsolatedNet:
    def __init__(self, engine_port: int) -> None:
        tag = f"{os.getpid() % 10000}{random.randrange(1000):03d}"
        self.name = f"cowfs-t{tag}"
        self.host_if, self.ns_if = f"cwh{tag}", f"cwn{tag}"
        octet = random.randrange(2, 250)
        self.host_ip, self.ns_ip = f"10.213.{octet}.1", f"10.213.{octet}.2"
        self.engine_port = engine_port
        self._relay: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def __enter__(self) -> "IsolatedNet":
        _ip("netns", "add", self.name)
        try:
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            _ip("link", "set", self.ns_if, "netns", self.name)
            _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            for args in (("addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if), ("link", "set", self.ns_if, "up"),
                         ("link", "set", "lo", "up")):
                _ip("-n", self.name, *args)
            self._relay = socket.create_server((self.host_ip, 0))
            self.relay_port = self._relay.getsockname()[1]
            threading.Thread(target=self._accept, daemon=True).start()
        except BaseException:
            self.__exit__()
            raise
        return self

    @property
    def endpoint(self) -> str:
        """The engine's URL as seen from inside."""
        return f"http://{self.host_ip}:{self.relay_port}"

    def command(self, *argv: str) -> list[str]:
        return ["nsenter", f"--net={Path('/run/netns') / self.name}", *argv]

    def cut(self) -> None:
        _ip("link", "set", self.host_if, "down")

    def join(self) -> None:
        _ip("link", "set", self.host_if, "up")

    def _accept(self) -> None:
        assert self._relay is not None
        while True:
            try:
                inside, _ = self._relay.accept()
            except OSError:
                return
            try:
                engine = socket.create_connection(("127.0.0.1", self.engine_port), timeout=10)
            except OSError:
                inside.close()
                continue
            with self._lock:
                self._conns += [inside, engine]
            for a, b in ((inside, engine), (engine, inside)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def __exit__(self, *exc: object) -> None:
        if self._relay is not None:
            self._relay.close()
        with self._lock:
            for s in self._conns:
                s.close()
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "delete", self.host_if], capture_output=True, timeout=30)
