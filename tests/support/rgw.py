"""A real one-node Ceph cluster (mon, bluestore OSD on a sparse file, radosgw) on 127.0.0.1
from Debian's packages, for the remote-tier tests (docs/remote-tests.md). All its files are
in the directory given, none in /etc/ceph or /var/lib/ceph; stop() ends exactly its pids.

    python -m tests.support.rgw start DIR   # one JSON line (endpoint, keys, pids), then up
                                            # until SIGTERM/SIGINT
"""
from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

# /usr/bin/python3 runs mon commands with python3-rados (a dependency of ceph-common)
BINARIES = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph", "ceph-authtool", "monmaptool",
            "/usr/bin/python3")
# the pools radosgw makes for the default zone: made up front with few PGs (faster than its own)
RGW_POOLS = (".rgw.root", "default.rgw.control", "default.rgw.meta", "default.rgw.log",
             "default.rgw.buckets.index", "default.rgw.buckets.data", "default.rgw.buckets.non-ec")
REGION = "default"  # the zonegroup's name: what SigV4 signs with
# mon commands in one client (a ceph CLI per command costs ~0.3 s); Debian's python3 has
# python3-rados, the venv's python has not
MON_COMMANDS = """
import json, sys, rados
c = rados.Rados(conffile=sys.argv[1], name="client.admin")
c.connect(timeout=float(sys.argv[2]))
for cmd in json.load(sys.stdin):
    ret, out, err = c.mon_command(json.dumps(cmd), b"", timeout=float(sys.argv[2]))
    if ret != 0:
        sys.exit(f"{cmd}: {ret} {err}")
"""


def missing_binaries() -> list[str]:
    """The Ceph programs this needs that are not on PATH (empty when all are installed)."""
    return [b for b in BINARIES if shutil.which(b) is None]


def free_ports(n: int) -> list[int]:
    """n distinct TCP ports free on 127.0.0.1 now."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM if the test process dies (even by SIGKILL)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class RgwError(RuntimeError):
    pass


@dataclass(frozen=True)
class RgwCredentials:
    endpoint: str      # http://127.0.0.1:PORT
    access_key: str
    secret_key: str
    region: str = REGION


def s3_client(creds: RgwCredentials, **overrides: str) -> Any:
    """A boto3 S3 client for RGW: SigV4, path-style addressing, no proxy from the
    environment; overrides replace access_key/secret_key (e.g. to test wrong ones)."""
    import boto3
    from botocore.config import Config
    c = {**asdict(creds), **overrides}
    return boto3.client("s3", endpoint_url=c["endpoint"], aws_access_key_id=c["access_key"],
                        aws_secret_access_key=c["secret_key"], region_name=c["region"],
                        config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                                      proxies={}, connect_timeout=10, read_timeout=120,
                                      retries={"max_attempts": 2}))


class RgwCluster:
    """One mon, one OSD and one radosgw under `root`; start() returns the S3 credentials."""

    def __init__(self, root: Path, *, osd_size: int = 8 << 30, timeout: float = 300.0,
                 extra_conf: str = "") -> None:
        self.root = Path(root).absolute()
        self.osd_size = osd_size
        self.extra_conf = extra_conf    # appended to ceph.conf (e.g. "[osd]\ndebug osd = 10")
        self.timeout = timeout          # for the whole bring-up: generous, CI may be loaded
        self.conf = self.root / "ceph.conf"
        self.keyring = self.root / "keyring"
        self.logs = self.root / "log"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}   # the daemons
        self.jobs: dict[str, subprocess.Popen[bytes]] = {}    # bring-up steps run alongside
        self.credentials: RgwCredentials | None = None
        self.startup_seconds: float | None = None
        self.fsid = ""
        self.mon_port = 0
        self.rgw_port = 0
        self.phases: dict[str, float] = {}   # bring-up step -> seconds since start, for reports

    # --- configuration ---------------------------------------------------------------

    def _write_conf(self) -> None:
        r = self.root
        self.conf.write_text(f"""\
[global]
fsid = {self.fsid}
mon host = [v2:127.0.0.1:{self.mon_port}]
mon initial members = a
public network = 127.0.0.0/8
cluster network = 127.0.0.0/8
ms bind ipv4 = true
ms bind ipv6 = false
ms bind msgr1 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
keyring = {self.keyring}
run dir = {r}/run
admin socket = $run_dir/$name.asok
pid file = $run_dir/$name.pid
log file = {self.logs}/$name.log
crash dir = {r}/crash
mon data = {r}/mon/$name
osd data = {r}/osd/$name
rgw data = {r}/rgw/$name
mon cluster log file = default={self.logs}/cluster.$channel.log cluster={self.logs}/cluster.log
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon max pg per osd = 1000
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim allowed = false
mon data avail crit = 1
mon data avail warn = 2
paxos propose interval = 0.1

[osd]
osd objectstore = bluestore
bluestore block create = true
bluestore block size = {self.osd_size}
bluestore fsck on mkfs = false
bluestore cache autotune = false
bluestore cache size = 128M
bluestore rocksdb options annex = write_buffer_size=33554432,max_write_buffer_number=2
osd op num shards = 2
osd op num threads per shard = 1
bdev aio poll ms = 20

[client.rgw.gw]
rgw frontends = beast endpoint=127.0.0.1:{self.rgw_port}
rgw thread pool size = 16
rgw enable apis = s3
rgw enable lc threads = false
rgw enable quota threads = false
rgw dynamic resharding = false
rgw override bucket index max shards = 1
rgw exit timeout secs = 10
{self.extra_conf}
""")

    # --- processes ----------------------------------------------------------------------

    def _run(self, *cmd: str, timeout: float = 120.0) -> str:
        """Run a tool to completion; raise with its output when it fails."""
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise RgwError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        return r.stdout

    def _mon_job(self, name: str, *cmds: dict[str, object]) -> subprocess.Popen[bytes]:
        """Mon commands (the JSON form of ceph CLI commands) run in order by one client."""
        return self._spawn(name, "/usr/bin/python3", "-c", MON_COMMANDS, str(self.conf), "120",
                           job=True, stdin=json.dumps(cmds).encode())

    def _spawn(self, name: str, *cmd: str, job: bool = False, stdin: bytes | None = None) -> subprocess.Popen[bytes]:
        """Start cmd as a child (a daemon, or a job that must exit 0), output in log/NAME.stdout."""
        with open(self.logs / f"{name}.stdout", "ab") as out:
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                                 stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        (self.jobs if job else self.procs)[name] = p
        if stdin is not None and p.stdin is not None:
            with p.stdin:
                p.stdin.write(stdin)
        return p

    def _log_tails(self, *names: str, lines: int = 40) -> str:
        parts: list[str] = []
        for f in (self.logs / f"{n}.{ext}" for n in names for ext in ("log", "stdout")):
            if f.exists() and (text := [x for x in f.read_text(errors="replace").splitlines() if x.strip()]):
                parts.append(f"--- tail of {f}\n" + "\n".join(text[-lines:]))
        return "\n".join(parts)

    def _wait(self, what: str, ok: Callable[[], bool], deadline: float, logs: tuple[str, ...]) -> None:
        """Poll ok() until it holds; raise with the daemons' log tails if a daemon exits or
        the deadline passes."""
        delay = 0.05
        while True:
            for name, p in [*self.procs.items(), *self.jobs.items()]:
                rc = p.poll()
                if rc is not None and (rc != 0 or name in self.procs):
                    raise RgwError(f"{name} exited ({rc}) while waiting for {what}\n"
                                   + self._log_tails(*dict.fromkeys((name, name.split("-")[0]))))
            if ok():
                return
            if time.monotonic() > deadline:
                raise RgwError(f"timed out waiting for {what}\n" + self._log_tails(*logs))
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    def _asok(self, name: str, *cmd: str) -> dict[str, Any] | None:
        """A daemon's admin socket command as JSON, None if it does not answer (yet)."""
        sock = self.root / "run" / f"{name}.asok"
        if not sock.exists():
            return None
        try:
            r = subprocess.run(["ceph", "--admin-daemon", str(sock), *cmd, "--format", "json"],
                               capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
            return json.loads(r.stdout) if r.returncode == 0 else None
        except (ValueError, subprocess.TimeoutExpired):
            return None

    def _http_answers(self) -> bool:
        try:   # no proxy from the environment for 127.0.0.1
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            opener.open(f"http://127.0.0.1:{self.rgw_port}/", timeout=2).close()
            return True
        except urllib.error.HTTPError:
            return True        # any HTTP answer means beast serves requests
        except (OSError, http.client.HTTPException):   # also a TCP self-connect's own echo
            return False

    @staticmethod
    def _keys_work(creds: RgwCredentials) -> bool:
        """A signed request with the new user's keys succeeds (our radosgw has the port)."""
        try:
            s3_client(creds).list_buckets()
            return True
        except Exception:
            return False

    # --- bring-up -------------------------------------------------------------------------

    def start(self) -> RgwCredentials:
        """Bring the cluster up and make an S3 user; on any failure stop what was started.
        A port taken between choosing and binding it gives one more try on new ports."""
        if missing := missing_binaries():
            raise RgwError(f"Ceph binaries not installed: {', '.join(missing)} (make setup)")
        if self.root.exists() and any(self.root.iterdir()):
            raise RgwError(f"{self.root} is not empty: an RgwCluster needs a new directory")
        t0 = self._t0 = time.monotonic()
        for attempt in (1, 2):
            try:
                self.credentials = self._start(t0 + self.timeout)
                break
            except BaseException as e:
                self.stop()
                if attempt == 2 or "Address already in use" not in str(e):
                    raise
                shutil.rmtree(self.root)
                self.procs, self.jobs, self.phases = {}, {}, {}
                self._phase("retry on new ports")
        self.startup_seconds = time.monotonic() - t0
        assert self.credentials is not None
        return self.credentials

    def _phase(self, name: str) -> None:
        self.phases[name] = round(time.monotonic() - self._t0, 2)

    def _start(self, deadline: float) -> RgwCredentials:
        for d in ("run", "log", "crash", "mon/mon.a", "osd/osd.0", "rgw/client.rgw.gw"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self.fsid = str(uuid.uuid4())
        self.mon_port, self.rgw_port = free_ports(2)
        self._write_conf()
        kr = str(self.keyring)
        self._run("ceph-authtool", "--create-keyring", kr, "--gen-key", "-n", "mon.", "--cap", "mon", "allow *")
        caps = {"client.admin": ("mon", "allow *", "osd", "allow *", "mgr", "allow *"),
                "osd.0": ("mon", "allow profile osd", "osd", "allow *", "mgr", "allow profile osd"),
                "client.rgw.gw": ("mon", "allow rw", "osd", "allow rwx", "mgr", "allow rw")}
        for name, cap in caps.items():
            # in the mon's initial keyring: the mon knows these entities from its first start
            self._run("ceph-authtool", kr, "--gen-key", "-n", name, "--cap", cap[0], cap[1],
                      "--cap", cap[2], cap[3], "--cap", cap[4], cap[5])
        monmap = str(self.root / "monmap")
        self._run("monmaptool", "--create", "--fsid", self.fsid, "--addv", "a",
                  f"[v2:127.0.0.1:{self.mon_port}]", monmap)
        self._run("ceph-mon", "-c", str(self.conf), "--mkfs", "-i", "a", "--monmap", monmap, "--keyring", kr)
        self._phase("mon mkfs")
        c = "-c", str(self.conf)
        self._spawn("mon.a", "ceph-mon", *c, "-f", "-i", "a")
        # the OSD's mkfs needs no mon: it runs while the mon comes up
        osd_uuid = str(uuid.uuid4())
        mkfs = self._spawn("osd.0-mkfs", "ceph-osd", *c, "--no-mon-config", "--mkfs", "-i", "0",
                           "--osd-uuid", osd_uuid, job=True)
        self._wait("the mon to lead", lambda: (self._asok("mon.a", "mon_status") or {}).get("state") == "leader",
                   deadline, ("mon.a",))
        self._phase("mon leads")
        new = self._mon_job("osd-new", {"prefix": "osd new", "uuid": osd_uuid, "id": 0})
        self._wait("osd new", lambda: new.poll() is not None, deadline, ("osd-new", "mon.a"))
        # radosgw's pools, with few PGs, made while the OSD's mkfs runs and the OSD boots
        pools = [{"prefix": "osd pool create", "pool": p, "pg_num": 8, "pgp_num": 8} for p in RGW_POOLS]
        pools += [{"prefix": "osd pool application enable", "pool": p, "app": "rgw"} for p in RGW_POOLS]
        made = self._mon_job("pools", *pools)
        self._wait("the OSD's mkfs", lambda: mkfs.poll() is not None, deadline, ("osd.0-mkfs", "osd.0"))
        self._phase("osd mkfs")
        self._spawn("osd.0", "ceph-osd", *c, "-f", "-i", "0")
        self._wait("the pools", lambda: made.poll() is not None, deadline, ("pools", "mon.a"))
        self._phase("pools made")
        # radosgw started before the OSD is up waits for its objecter's next tick (5 s)
        self._wait("the OSD to boot", lambda: (self._asok("osd.0", "status") or {}).get("state") == "active",
                   deadline, ("osd.0", "mon.a"))
        self._phase("osd up")
        self._spawn("client.rgw.gw", "radosgw", *c, "-f", "-n", "client.rgw.gw")
        self._wait("radosgw to answer HTTP", self._http_answers, deadline, ("client.rgw.gw", "osd.0", "mon.a"))
        self._phase("rgw answers")
        user = json.loads(self._run("radosgw-admin", "-c", str(self.conf), "user", "create",
                                    "--uid", "cowfs-test", "--display-name", "cowfs tests",
                                    timeout=max(10.0, deadline - time.monotonic())))
        key = user["keys"][0]
        creds = RgwCredentials(f"http://127.0.0.1:{self.rgw_port}", key["access_key"], key["secret_key"])
        self._wait("radosgw to take the new user's keys", lambda: self._keys_work(creds), deadline,
                   ("client.rgw.gw",))
        return creds

    def restart_gateway(self, timeout: float = 120.0) -> None:
        """radosgw killed (SIGKILL) and started again on the same port, the cluster behind it
        untouched: what an engine's restart looks like to its clients."""
        name = "client.rgw.gw"
        old = self.procs[name]
        old.kill()
        old.wait()
        self._spawn(name, "radosgw", "-c", str(self.conf), "-f", "-n", name)
        self._wait("radosgw to answer HTTP again", self._http_answers, time.monotonic() + timeout, (name,))

    # --- teardown and inspection ----------------------------------------------------------

    @property
    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.procs.items()}

    def rss_bytes(self, peak: bool = False) -> int:
        """The daemons' resident memory summed: now (VmRSS) or each one's peak (VmHWM)."""
        total, field = 0, "VmHWM:" if peak else "VmRSS:"
        for p in self.procs.values():
            try:
                for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                    if line.startswith(field):
                        total += int(line.split()[1]) * 1024
            except OSError:
                pass
        return total

    def stop(self, timeout: float = 20.0) -> None:
        """End the processes this started: bring-up jobs and radosgw first (it hangs on I/O
        once the OSD is gone), then the OSD, then the mon; each group gets SIGTERM and
        `timeout` seconds, then SIGKILL. Safe to call more than once."""
        daemons = list(self.procs.items())
        groups = [[*self.jobs.values(), *(p for n, p in daemons if n.startswith("client."))],
                  [p for n, p in daemons if n.startswith("osd.")],
                  [p for n, p in daemons if n.startswith("mon.")]]
        for group in groups:
            for p in group:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for p in group:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    def __enter__(self) -> RgwCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "start":
        print("usage: python -m tests.support.rgw start DIR", file=sys.stderr)
        return 2

    def on_signal(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # stop() is not interrupted by a second
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise SystemExit(0)   # unwinds through the with: stop() ends the daemons

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with RgwCluster(Path(argv[1])) as c:
        assert c.credentials is not None
        print(json.dumps({**asdict(c.credentials), "pids": c.pids, "phases": c.phases,
                          "startup_seconds": round(c.startup_seconds or 0, 1)}), flush=True)
        while True:
            signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
