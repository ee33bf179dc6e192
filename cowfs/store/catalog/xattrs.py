"""Extended attributes: kept in the inode's version row (versions.xattrs), so they are
versioned with its other metadata and a snapshot shows them as they were.

Encoding of versions.xattrs (docs/format.md): the attributes sorted by name, each as
  u8   name length (1-255)
  ...  name bytes (e.g. b"user.origin")
  u32  value length, little-endian (0-65536)
  ...  value bytes
and NULL when the inode has none. Limits as on Linux (XATTR_NAME_MAX, XATTR_SIZE_MAX);
all of one inode's attributes together stay within MAX_TOTAL, beyond it ENOSPC (ext4
also bounds them per inode, at one block).
"""
from __future__ import annotations

import errno
import sqlite3
import struct

from ...errors import CowfsError, Exists, NoAttribute, NoSpace
from . import namespace as ns
from .db import Txn

NAME_MAX = 255          # XATTR_NAME_MAX
VALUE_MAX = 65536       # XATTR_SIZE_MAX
MAX_TOTAL = 1 << 17     # encoded bytes of one inode's attributes
# what the kernel passes on: user.* (regular files and directories, checked by the kernel),
# trusted.* (CAP_SYS_ADMIN, checked by the kernel) and security.* (SELinux labels, file
# capabilities). system.* names POSIX ACLs, which cowfs does not enforce: refused as ext4
# mounted without acl does.
NAMESPACES = (b"user.", b"trusted.", b"security.")

# asked by the kernel before every write(2) to a file (to drop file capabilities): the
# mount answers it without a catalog query while no version of the store has it
CAPABILITY = b"security.capability"

XATTR_CREATE = 1        # setxattr flags (linux/xattr.h)
XATTR_REPLACE = 2

_VALUE_LEN = struct.Struct("<I")


def encode(attrs: dict[bytes, bytes]) -> bytes | None:
    if not attrs:
        return None
    out = bytearray()
    for name in sorted(attrs):
        value = attrs[name]
        out.append(len(name))
        out += name
        out += _VALUE_LEN.pack(len(value))
        out += value
    return bytes(out)


def decode(blob: bytes | None) -> dict[bytes, bytes]:
    attrs: dict[bytes, bytes] = {}
    if not blob:
        return attrs
    view, pos = memoryview(blob), 0
    while pos < len(view):
        n = view[pos]
        start = pos + 5 + n
        if not n or start > len(view):
            raise ValueError("truncated extended attribute list")
        name = bytes(view[pos + 1:pos + 1 + n])
        (length,) = _VALUE_LEN.unpack_from(view, pos + 1 + n)
        if start + length > len(view):
            raise ValueError("truncated extended attribute list")
        attrs[name] = bytes(view[start:start + length])
        pos = start + length
    return attrs


def any_capability(conn: sqlite3.Connection) -> bool:
    """Whether some version (live or in history) may carry CAPABILITY (a value that holds
    the name's bytes also says yes: it only costs the fast answer)."""
    return conn.execute("SELECT 1 FROM versions WHERE xattrs IS NOT NULL AND instr(xattrs, ?) > 0 LIMIT 1",
                        (CAPABILITY,)).fetchone() is not None


def check_name(name: bytes) -> None:
    if not name or len(name) > NAME_MAX:
        raise CowfsError(f"extended attribute name of {len(name)} bytes", errno=errno.ERANGE)
    if not name.startswith(NAMESPACES) or name in NAMESPACES:
        raise CowfsError(f"extended attribute {name.decode(errors='replace')!r}: not supported "
                         "(user.*, trusted.* and security.* are)", errno=errno.EOPNOTSUPP)


def read(blob: bytes | None, name: bytes) -> bytes:
    value = decode(blob).get(name)
    if value is None:
        raise NoAttribute(f"no extended attribute {name.decode(errors='replace')!r}")
    return value


def set_(txn: Txn, ino: int, name: bytes, value: bytes, flags: int = 0) -> None:
    """setxattr(2) of the live inode: a new version row with the new list and ctime."""
    check_name(name)
    if len(value) > VALUE_MAX:
        raise CowfsError(f"extended attribute value of {len(value)} bytes", errno=errno.E2BIG)
    row = ns.live_version(txn, ino)
    attrs = decode(row.xattrs)
    if flags & XATTR_CREATE and name in attrs:
        raise Exists(f"extended attribute {name.decode(errors='replace')!r} exists")
    if flags & XATTR_REPLACE and name not in attrs:
        raise NoAttribute(f"no extended attribute {name.decode(errors='replace')!r}")
    attrs[name] = value
    blob = encode(attrs)
    if blob is not None and len(blob) > MAX_TOTAL:
        raise NoSpace(f"extended attributes of inode {ino} would take {len(blob)} bytes (at most {MAX_TOTAL})")
    ns.new_version(txn, row, xattrs=blob, ctime_ns=txn.now_ns)


def remove(txn: Txn, ino: int, name: bytes) -> None:
    row = ns.live_version(txn, ino)
    attrs = decode(row.xattrs)
    if attrs.pop(name, None) is None:
        raise NoAttribute(f"no extended attribute {name.decode(errors='replace')!r}")
    ns.new_version(txn, row, xattrs=encode(attrs), ctime_ns=txn.now_ns)
