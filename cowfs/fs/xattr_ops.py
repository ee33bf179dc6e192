"""The extended attribute requests (getxattr, listxattr, setxattr, removexattr) of
CowfsOperations. Reads run inline on the read connection (the kernel may ask for
security.capability before writes: no thread hop for that); changes are a catalog
transaction each, in a worker thread. Snapshots' attributes are read-only."""
from __future__ import annotations

import errno
from typing import TYPE_CHECKING

import pyfuse3

from .dispatch import in_thread, translate_errors
from .views import SNAPDIR_INO

if TYPE_CHECKING:
    from ..store import Store
    from .views import View


class XattrOperations:
    """Mixed into CowfsOperations, which provides what is declared here."""

    if TYPE_CHECKING:
        store: Store

        def _decode(self, fuse_ino: int) -> tuple[View, int]: ...

        def _live(self, fuse_ino: int) -> int: ...

        def store_of(self, view: View) -> Store: ...

    @translate_errors
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        if inode == SNAPDIR_INO:
            raise pyfuse3.FUSEError(errno.ENODATA)
        view, ino = self._decode(inode)
        store = self.store_of(view)
        if not store.may_have_xattr(name):
            raise pyfuse3.FUSEError(errno.ENODATA)  # asked before each write(2): answered without a query
        return store.getxattr(ino, name, view.gen)

    @translate_errors
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        if inode == SNAPDIR_INO:
            return []
        view, ino = self._decode(inode)
        return self.store_of(view).listxattr(ino, view.gen)

    @translate_errors
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: pyfuse3.RequestContext) -> None:
        ino = self._live(inode)
        await in_thread(self.store.setxattr, ino, name, value)

    @translate_errors
    async def removexattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        ino = self._live(inode)
        await in_thread(self.store.removexattr, ino, name)
