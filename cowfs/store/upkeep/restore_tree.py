"""Restore a directory as of an earlier generation into the live tree, in one transaction.

Every file, subdirectory, symlink, fifo, socket and device node is made anew under the
destination name with the old one's mode, owner, times (HF Trainer's rotation orders
checkpoints by mtime), device number and extended attributes, and
each file's new version shares the old version's body: no bytes are copied. Names that
shared an inode in the old tree are hard links again. Because it is one transaction,
an interrupted restore leaves nothing, never a checkpoint directory without its
trainer_state.json."""
from __future__ import annotations

import stat
from dataclasses import dataclass

from ...errors import Exists, NotADirectory
from ..catalog import namespace as ns
from ..catalog.db import Txn
from ..catalog.namespace import Attr
from ..catalog.schema import KIND_DIR, KIND_FILE, KIND_SPECIAL, KIND_SYMLINK


@dataclass
class RestoredTree:
    root: Attr            # the new directory, as of the restore's generation
    parent: int           # the inode of the directory it was made in
    files: list[int]      # inodes of the files made (each once)
    bytes: int            # their sizes together


def _kind(mode: int) -> int:
    if stat.S_ISDIR(mode):
        return KIND_DIR
    if stat.S_ISLNK(mode):
        return KIND_SYMLINK
    return KIND_FILE if stat.S_ISREG(mode) else KIND_SPECIAL


def restore_dir(txn: Txn, src: Attr, gen: int, parent: int, name: bytes, dest: str) -> RestoredTree:
    """Make `name` in directory `parent` a copy of directory `src` as of generation `gen`."""
    if not ns.getattr_(txn.conn, parent, txn.gen).is_dir:
        raise NotADirectory(f"{dest}: its parent is not a directory")
    if ns.live_child(txn, parent, name) is not None:
        raise Exists(f"{dest}: already exists; remove it first, or restore to another path with --to")
    made: dict[int, int] = {}  # old inode -> new inode (hard links inside the tree stay links)
    out = RestoredTree(src, parent, [], 0)

    def copy(old: Attr, into: int, entry: bytes) -> int:
        if old.ino in made and not old.is_dir:
            ns.link(txn, made[old.ino], into, entry)
            return made[old.ino]
        target = ns.readlink(txn.conn, old.ino, gen) if old.is_symlink else None
        ino = ns.make_node(txn, into, entry, _kind(old.mode), old.mode, old.uid, old.gid, target, old.rdev)
        made[old.ino] = ino
        if old.is_dir:
            for child_name, child in ns.readdir(txn.conn, old.ino, gen):
                copy(child, ino, child_name)
        row = ns.version_row_or_fail(txn.conn, old.ino, gen)
        # exactly as it was (make_node may have given it a set-group-ID directory's group)
        changes: dict[str, object] = {"mtime_ns": old.mtime_ns, "atime_ns": old.atime_ns, "mode": old.mode,
                                      "gid": old.gid, "xattrs": row.xattrs}
        if old.is_file:
            changes.update(size=old.size, content_id=old.content_id, data_gen=txn.gen)
            out.files.append(ino)
            out.bytes += old.size
        ns.new_version(txn, ns.live_version(txn, ino), **changes)  # born in this transaction: in place
        return ino

    root = copy(src, parent, name)
    out.root = ns.getattr_(txn.conn, root, txn.gen)
    return out
