"""Which build of pyfuse3 serves the mount.

Stock pyfuse3 holds the GIL while its one request loop copies every byte: a WRITE's data
out of the kernel (`fuse_session_receive_buf`, then `fuse_buf_copy` into a bytes object)
and a READ's reply into it (`fuse_reply_buf`). Every other thread of the daemon waits
meanwhile, which bounds one mount at about 1-1.5 GB/s however many cores it has
(docs/benchmarks.md, "The GIL bounds one mount"). `make setup` therefore builds pyfuse3
from its source release with `native/pyfuse3/cowfs.patch`, which releases the GIL
around those three calls, lets the file system ask for smaller WRITE requests
(`Operations.max_write`: ones that libfuse can splice, fs/write_requests.py), and takes a
request that is already queued without first waiting for the fd to become readable (a trio
lock and an epoll round trip per request: a quarter of the FUSE thread's CPU per small file),
and changes nothing else (tools/pyfuse3_build.py); it installs it with the local version
label below. cowfs runs on a stock pyfuse3 as well, only slower; the daemon says at mount
which one it has.
"""
from __future__ import annotations

import importlib.metadata

# the local version label (PEP 440) of the patched build; gil1 had no max_write, gil2 waited
# on the fd before every request
PATCH_LABEL = "cowfs.gil3"
PATCHED_RELEASE = "3.5.0"  # the pyfuse3 release the patch is made for


def pyfuse3_version() -> str:
    try:
        return importlib.metadata.version("pyfuse3")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def patched_version() -> str:
    return f"{PATCHED_RELEASE}+{PATCH_LABEL}"


def is_patched(version: str | None = None) -> bool:
    """Whether this pyfuse3 build is the one made with cowfs's patch (the GIL released, max_write)."""
    v = pyfuse3_version() if version is None else version
    return v.partition("+")[2] == PATCH_LABEL


def describe(version: str | None = None) -> str:
    v = pyfuse3_version() if version is None else version
    if is_patched(v):
        return f"pyfuse3 {v}: copies without the GIL"
    return (f"pyfuse3 {v} (stock): its request loop holds the GIL while it copies every byte; "
            f"`make setup` builds the patched one (tools/pyfuse3_build.py)")
