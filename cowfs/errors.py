"""Errors raised by the cowfs engine and CLI.

Every error carries an errno so the FUSE layer can translate it 1:1 and the CLI
can print a one-line message. Nothing here knows about FUSE.
"""
from __future__ import annotations

import errno as _errno


class CowfsError(Exception):
    """Base class: a clear, one-line, user-facing error."""

    errno: int = _errno.EIO

    def __init__(self, message: str, *, errno: int | None = None) -> None:
        super().__init__(message)
        if errno is not None:
            self.errno = errno


class NotFound(CowfsError):
    errno = _errno.ENOENT


class Exists(CowfsError):
    errno = _errno.EEXIST


class NotEmpty(CowfsError):
    errno = _errno.ENOTEMPTY


class NotADirectory(CowfsError):
    errno = _errno.ENOTDIR


class IsADirectory(CowfsError):
    errno = _errno.EISDIR


class ReadOnly(CowfsError):
    errno = _errno.EROFS


class InvalidArgument(CowfsError):
    errno = _errno.EINVAL


class HistoryDropped(InvalidArgument):
    """A past generation asked for (a snapshot pinned at it) whose history was dropped since."""


class NotPermitted(CowfsError):
    errno = _errno.EPERM


class NoAttribute(CowfsError):
    errno = _errno.ENODATA


class Busy(CowfsError):
    errno = _errno.EBUSY


class NoSpace(CowfsError):
    errno = _errno.ENOSPC


class StoreError(CowfsError):
    """The store directory is missing, not a store, or of another format."""

    errno = _errno.EINVAL


class CorruptData(CowfsError):
    """Stored bytes fail their checksum: the read fails rather than lie.

    A reader of a file version fills in which one (`ino`, `vid`, `generation`: the
    generation that made that version current), so the failure can be reported by path."""

    errno = _errno.EIO
    ino: int | None = None
    vid: int | None = None
    generation: int | None = None


class CorruptCatalog(CorruptData):
    """The SQLite catalog is damaged: not a database, or pages that fail SQLite's checks."""


class RemoteError(CowfsError):
    """The remote tier (an S3 bucket) failed: unreachable endpoint, refused credentials,
    missing bucket, or an object that is missing or damaged. One line, never a secret."""

    errno = _errno.EIO


class MountError(CowfsError):
    """A mount or unmount that cannot be done as asked."""

    errno = _errno.EINVAL
