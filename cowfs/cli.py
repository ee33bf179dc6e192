"""The `cowfs` command line. Errors are one line on stderr: exit 2 for bad input,
1 when a check ran and found a problem (fsck), 0 otherwise."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import NoReturn, Sequence

from .cli_common import TARGET_HELP, fmt_time, progress_bar
from .cli_history import add_commands
from .cli_remote import add_commands as add_remote_commands
from .control import Target, store_of
from .errors import CorruptCatalog, CowfsError, InvalidArgument, StoreError
from .store.log.layout import CONFIG_FILE, DEFAULT_DEVICE, DEFAULT_SEGMENT_SIZE, DEVICES, MAX_CHAIN, read_config, set_read_chain
from .units import human_bytes, parse_size

CAT_PROGRESS_MIN = 256 << 20  # cat shows a bar (stderr on a terminal) for files bigger than this
EPILOG_INIT = "example: cowfs init /nvme/ckpt-store --segment-size 256M"


def cmd_init(args: argparse.Namespace) -> int:
    from .store import Store  # noqa: PLC0415 - the engine: not imported by commands that go to a daemon

    size = parse_size(args.segment_size) if args.segment_size else DEFAULT_SEGMENT_SIZE
    cfg = Store.init(args.store, device=args.device, segment_size=size, read_chain=args.read_chain)
    print(f"initialised cowfs store {args.store} (device {cfg.device}, segments of {human_bytes(cfg.segment_size)}, "
          f"reads of compacted pieces through at most {cfg.read_chain} records)")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    store = store_of(args.store)  # a mountpoint: its store's settings
    mounted = store != Path(args.store).absolute()
    if mounted and not (store / CONFIG_FILE).exists():  # a consumer's mount names its cache
        raise StoreError(f"{args.store} is a consumer's mount (a read-only replica): the settings are its "
                         "producer's store's")
    if args.read_chain is not None:
        if mounted:
            raise StoreError(f"{args.store} is a mount of {store}: unmount it, then change the settings of {store}")
        before, _after = set_read_chain(store, args.read_chain)
        print(f"{store}: read chain {args.read_chain} (was {before}); compaction keeps to it from its next run, "
              "pieces compacted before keep their chains")
        return 0
    cfg = read_config(store)
    shown = {"store": str(store), "format_version": cfg.format_version, "store_uuid": cfg.store_uuid,
             "device": cfg.device, "segment_size": cfg.segment_size, "read_chain": cfg.read_chain}
    if args.json:
        print(json.dumps(shown, indent=2))
    else:
        for key, value in shown.items():
            print(f"{key:15} {human_bytes(value) if key == 'segment_size' else value}")
    return 0


def cmd_upgrade(args: argparse.Namespace) -> int:
    from .store.catalog.upgrade import upgrade

    before, after = upgrade(Path(args.store).absolute())
    print(f"{args.store}: format version {after}" + (f" (upgraded from {before})" if before != after else " already"))
    return 0


def cmd_fsck(args: argparse.Namespace) -> int:
    try:
        target = Target(args.store)
    except CorruptCatalog as e:  # a problem found (exit 1), not bad input: nothing can be checked or repaired
        print(f"cowfs: {e}", file=sys.stderr)
        return 1
    with target as t:
        if t.mounted and args.repair:
            raise StoreError(f"{store_of(args.store)}: the store is mounted; unmount it to run fsck --repair "
                             "(a check without --repair runs while mounted)")
        r = t.call("fsck", repair=args.repair, progress=progress_bar("fsck"))
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        for line in r["problems"]:
            print(line)
        for line in r["repaired"]:
            print(f"repaired: {line}")
        state = "clean" if r["clean"] else f"{len(r['remaining'])} problem(s)"
        evicted = (f", {r['segments_evicted']} segments kept only in the bucket (cowfs remote fsck checks them)"
                   if r.get("segments_evicted") else "")
        print(
            f"fsck: {state}: {r['chunks_checked']} chunks, {human_bytes(r['bytes_checked'])} verified in "
            f"{r['segments_checked']} segments, {human_bytes(r['unreferenced_bytes'])} unreferenced (gc reclaims it)"
            + evicted
        )
    return 0 if r["clean"] else 1


def cmd_stats(args: argparse.Namespace) -> int:
    with Target(args.store) as t:
        stats = t.call("stats")
    if args.json:
        print(json.dumps(stats, indent=2))
    else:
        for key, value in stats.items():
            if isinstance(value, dict):  # per codec: chunks, unique and stored bytes
                for name, c in value.items():
                    print(f"{'codec ' + name:18} {c['chunks']} chunks, {human_bytes(c['unique_bytes'])} "
                          f"stored in {human_bytes(c['stored_bytes'])}")
                continue
            shown = human_bytes(value) if key.endswith("_bytes") else value
            print(f"{key:18} {shown}")
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    with Target(args.store) as t:
        r = t.call("compact", progress=progress_bar("compact", human_bytes))
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"compact: {r['recut']} of {r['bodies']} files re-cut ({human_bytes(r['logical_bytes'])}), "
          f"{r['pieces']} tensor pieces, {r['new_chunks']} stored anew, {r['deltas']} turned into deltas; "
          f"stored {human_bytes(r['stored_bytes_before'])} -> {human_bytes(r['stored_bytes'])} "
          f"of {human_bytes(r['logical_bytes_total'])} logical in {r['seconds']:.2f}s; the records it replaced "
          f"given back: {human_bytes(r['gc_bytes_freed'])} freed on the device")
    for e in r["errors"]:
        print(f"warning: {e}", file=sys.stderr)
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    with Target(args.store) as t:
        r = t.call("gc", progress=progress_bar("gc"))
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"gc: {r['chunks_deleted']} chunks deleted, {human_bytes(r['bytes_freed'])} freed on the device "
          f"({human_bytes(r['physical_bytes'])} in use) in {r['seconds']:.2f}s")
    return 0


def cmd_log(args: argparse.Namespace) -> int:
    with Target(args.store) as t:
        versions = t.call("log", path=args.path)
    rows = [
        {"generation": v["generation"], "time": fmt_time(v["time_ns"]), "size": v["size"], "added_bytes": v["added_bytes"],
         "added_stored_bytes": v["added_stored_bytes"], "current": v["current"]}
        for v in versions
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'GENERATION':>10}  {'TIME':20}  {'SIZE':>12}  {'ADDED':>12}  {'STORED':>12}")
        for r in rows:
            print(f"{r['generation']:>10}  {r['time']:20}  {r['size']:>12}  {r['added_bytes']:>12}"
                  f"  {r['added_stored_bytes']:>12}{'  (current)' if r['current'] else ''}")
    return 0


def _as_of(args: argparse.Namespace) -> dict[str, object]:
    return {"snapshot": args.snapshot, "generation": args.generation}


def cmd_cat(args: argparse.Namespace) -> int:
    with Target(args.store) as t:
        size = t.call("file_size", path=args.path, **_as_of(args))
        out = sys.stdout.buffer
        show = progress_bar(args.path, human_bytes) if size > CAT_PROGRESS_MIN and not sys.stdout.isatty() else None
        pos = 0
        while pos < size:
            data = t.call("read", path=args.path, offset=pos, length=8 << 20, **_as_of(args))
            if not data:
                break
            out.write(data)
            pos += len(data)
            if show is not None:
                show(pos, size)
        out.flush()
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    with Target(args.store) as t:
        entries = t.call("ls", path=args.path, **_as_of(args))
    for e in entries:
        kind = {"dir": "d", "symlink": "l", "fifo": "p", "socket": "s", "char": "c", "block": "b"}.get(e["kind"], "-")
        print(f"{kind}{e['mode']:04o} {e['size']:>12} {fmt_time(e['mtime_ns'])} {e['name']}")
    return 0


DIFF_MARK = {"added": "A", "removed": "D", "changed": "M"}


def cmd_diff(args: argparse.Namespace) -> int:
    with Target(args.store) as t:
        r = t.call("diff", a=args.a, b=args.b)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    for e in r["entries"]:
        kind = "/" if e["kind"] == "dir" else "@" if e["kind"] == "symlink" else ""
        if e["change"] == "removed":
            sizes = human_bytes(e["size_a"])
        elif e["change"] == "added":
            sizes = f"{human_bytes(e['size_b'])}, {human_bytes(e['shared_bytes'])} shared"
        else:
            sizes = f"{human_bytes(e['size_a'])} -> {human_bytes(e['size_b'])}, {human_bytes(e['shared_bytes'])} shared"
        print(f"{DIFF_MARK[e['change']]}  {e['path']}{kind}  ({sizes})" if e["kind"] != "dir" else f"{DIFF_MARK[e['change']]}  {e['path']}/")
    n = r["summary"]
    print(f"{r['a']['ref']} (generation {r['a']['generation']}) -> {r['b']['ref']} (generation {r['b']['generation']}): "
          f"{n['added']} added, {n['removed']} removed, {n['changed']} changed, {n['unchanged']} unchanged; "
          f"{human_bytes(n['new_bytes'])} not in {r['a']['ref']}")
    return 0


def _event_line(e: dict[str, object]) -> str:
    when = fmt_time(int(e["time_ns"]))  # type: ignore[arg-type]
    kind, gen = e["kind"], e["generation"]
    if kind == "version":
        what = f"{e['path']}  {e['size']} bytes, {e['added_bytes']} new"
    elif kind == "rename":
        what = f"{e['old_path']} -> {e['path']}"
    elif kind in ("snapshot", "snapshot-delete"):
        what = str(e["snapshot"])
    else:
        what = str(e["path"])
    return f"{when}  {kind:15} {gen:>8}  {what}"


def cmd_watch(args: argparse.Namespace) -> int:
    with Target(args.store) as t:
        try:
            events = t.watch(args.path)
            # as inotifywait's "Watches established.": a script may start its changes from here
            print(f"cowfs: watching {args.store}{' ' + args.path if args.path else ''} (Ctrl-C ends)",
                  file=sys.stderr, flush=True)
            for event in events:
                print(json.dumps(event) if args.json else _event_line(event), flush=True)
        except KeyboardInterrupt:
            return 0  # Ctrl-C is how a watch is meant to end
    print(f"cowfs: {args.store}: unmounted; watch ends", file=sys.stderr)
    return 0


def cmd_mount(args: argparse.Namespace) -> int:
    if args.store.startswith("s3://"):
        return _mount_remote(args)
    remote_only = [f for f, v in (("--cache", args.cache), ("--endpoint", args.endpoint), ("--store", args.store_uuid))
                   if v is not None]
    if remote_only:
        raise InvalidArgument(f"{remote_only[0]}: only for a remote mount (cowfs mount s3://BUCKET/PREFIX ...)")
    from .fs.mount import mount

    return mount(args.store, args.mountpoint, foreground=args.foreground, allow_other=args.allow_other,
                 auto_snapshot=args.auto_snapshot, debug=args.debug, writeback_cache=args.writeback_cache,
                 compact_idle=args.compact_idle, workers=args.workers, snapshot_on=args.snapshot_on,
                 vfs_options=getattr(args, "vfs_options", ()),  # set by mount.cowfs (mount_helper.py)
                 all_stores=args.all_stores, peers_cache_size=parse_size(args.cache_size))


def _mount_remote(args: argparse.Namespace) -> int:
    producer_only = [f for f, v in (("--auto-snapshot", args.auto_snapshot),
                                    ("--writeback-cache", args.writeback_cache), ("--workers", args.workers))
                     if v is not None]
    if producer_only:
        raise InvalidArgument(f"{producer_only[0]}: not for a read-only remote mount")
    if args.all_stores and args.store_uuid is not None:
        raise InvalidArgument("--store and --all-stores: pick one store, or show them all")
    from .fs.replica_mount import mount_replica

    creds = None if args.credentials is None else os.path.abspath(args.credentials)
    return mount_replica(args.store, args.mountpoint, cache=args.cache, endpoint=args.endpoint, region=args.region,
                         credentials_file=creds, profile=args.profile, store_uuid=args.store_uuid,
                         all_stores=args.all_stores, foreground=args.foreground, allow_other=args.allow_other,
                         cache_size=parse_size(args.cache_size), debug=args.debug, snapshot_on=args.snapshot_on)


def cmd_umount(args: argparse.Namespace) -> int:
    from .unmount import umount

    return umount(args.mountpoint)


class OneLineErrors(argparse.ArgumentParser):
    """Usage errors as one line on stderr, exit 2, like every other cowfs error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"cowfs: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrors(
        prog="cowfs",
        description="cowfs: deduplicated, crash-consistent, versioned storage for ML checkpoints.",
        epilog="example: cowfs init /data/store && cowfs stats /data/store",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("init", help="create a new store", description="Create a new, empty store directory.", epilog=EPILOG_INIT)
    s.add_argument("store", help="directory to create (must be missing or empty)")
    s.add_argument("--device", choices=DEVICES, default=DEFAULT_DEVICE,
                   help=f"default {DEFAULT_DEVICE}. direct: O_DIRECT writes of whole 4 KiB blocks + fdatasync, "
                        "bypassing the page cache (NVMe, SSD; plain writes where the filesystem has no O_DIRECT); "
                        "file: pwrite into the page cache + fdatasync; pmem: mmap + cache-line flush "
                        "(persistent memory)")
    s.add_argument("--segment-size", metavar="SIZE", help="log segment size, e.g. 256M (default 256M, min 4M)")
    s.add_argument("--read-chain", metavar="N", type=int, default=MAX_CHAIN,
                   help=f"records a read of one compacted tensor piece may touch, 1 to {MAX_CHAIN} (default "
                   f"{MAX_CHAIN}): fewer store older checkpoints larger and read them faster; 1 stores no deltas")
    s.set_defaults(fn=cmd_init)

    s = sub.add_parser("config", help="show or change a store's settings",
                       description="Show the settings of STORE (a store directory, or the mountpoint of one), or "
                       "change them (STORE not mounted).",
                       epilog="example: cowfs config /nvme/ckpt-store --read-chain 2")
    s.add_argument("store")
    s.add_argument("--read-chain", metavar="N", type=int,
                   help=f"records a read of one compacted tensor piece may touch from the next compaction on, "
                   f"1 to {MAX_CHAIN}")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_config)

    s = sub.add_parser("upgrade", help="upgrade a store made by an older cowfs",
                       description="Bring STORE (unmounted) to this cowfs's format version, in place.",
                       epilog="example: cowfs upgrade /nvme/ckpt-store")
    s.add_argument("store")
    s.set_defaults(fn=cmd_upgrade)

    s = sub.add_parser("mount", help="mount a store", description="Mount STORE on MOUNTPOINT. Returns once the mount is live; "
                       "the daemon runs in the background and logs to STORE/cowfs.log.",
                       epilog="example: cowfs mount /nvme/store /mnt/ckpt --auto-snapshot 10m")
    s.add_argument("store")
    s.add_argument("mountpoint", help="an existing, empty directory")
    s.add_argument("--foreground", action="store_true", help="stay in the foreground and log to stderr too")
    s.add_argument("--allow-other", action="store_true", help="let other users access the mount (FUSE allow_other)")
    s.add_argument("--auto-snapshot", metavar="DURATION", help="take a snapshot every DURATION (e.g. 10m, 1d12h; at least 1s) when no file is open for writing")
    s.add_argument("--snapshot-on", choices=["checkpoint"],
                   help="checkpoint: snapshot each checkpoint as it completes (HF Trainer, Lightning, "
                   "torch.distributed.checkpoint, DeepSpeed), named RUN@step-N; on a consumer of every store "
                   "(--all-stores) each is pinned in the bucket")
    s.add_argument("--compact-idle", metavar="DURATION", default="30s",
                   help="compact committed files (see `cowfs compact`) once no file has been open for writing for "
                   "DURATION (default 30s, at least 1s); 'off' leaves it to `cowfs compact`")
    s.add_argument("--debug", action="store_true", help="log every commit")
    s.add_argument("--writeback-cache", action=argparse.BooleanOptionalAction, default=None,
                   help="let the kernel cache writes and send them back in large pieces, in its own order "
                   "(default: off, measured in docs/benchmarks.md)")
    s.add_argument("--workers", type=int, metavar="N",
                   help="threads for per-byte work (chunking, hashing, appending, reading ahead), per pool "
                   "(default: one per CPU)")
    r = s.add_argument_group("remote mounts (STORE is s3://BUCKET/PREFIX: a read-only replica that follows the "
                             "producer's new versions)")
    r.add_argument("--read-only", action="store_true", help="a remote mount is always read-only (accepted for clarity)")
    r.add_argument("--cache", metavar="DIR", help="local directory for the replica's catalog and cached blocks")
    r.add_argument("--cache-size", metavar="SIZE", default="10G", help="cached blocks kept at most (default 10G)")
    r.add_argument("--endpoint", metavar="URL", help="the S3 endpoint")
    r.add_argument("--region", help="region name (default us-east-1)")
    r.add_argument("--credentials", metavar="FILE", help="an AWS credentials file (default: AWS_* variables)")
    r.add_argument("--profile", help="its section (default: default)")
    r.add_argument("--store", dest="store_uuid", metavar="UUID", help="the store to follow when several share the prefix")
    r.add_argument("--all-stores", action="store_true",
                   help="show the union of every store under the prefix (the nodes of one job), following stores "
                   "as they appear; where two stores hold one path, the later commit wins (docs/design.md). "
                   "On a store's own mount (its remote set): the other stores' files beside its own, read-only, "
                   "the later change showing where both hold a path; --cache-size bounds their cached blocks")
    s.set_defaults(fn=cmd_mount)

    s = sub.add_parser("umount", help="unmount", description="Commit what is open, unmount, and wait for the daemon to exit.",
                       epilog="example: cowfs umount /mnt/ckpt")
    s.add_argument("mountpoint")
    s.set_defaults(fn=cmd_umount)

    s = sub.add_parser("fsck", help="check a store", description="Check every record checksum, every reference and the space "
                       "accounting. Exit 0 when clean, 1 when not. Runs on a mounted store too (through its daemon, "
                       "beside the writers); --repair needs it unmounted.",
                       epilog="example: cowfs fsck /data/store --repair")
    s.add_argument("store", metavar="TARGET", help=TARGET_HELP)
    s.add_argument("--repair", action="store_true", help="fix what can be fixed without touching intact committed data (unmounted only)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(fn=cmd_fsck)

    s = sub.add_parser("stats", help="space and object counts", description="Show logical, stored and physical bytes, counts and the dedup ratio.",
                       epilog="example: cowfs stats /mnt/ckpt --json")
    s.add_argument("store", metavar="TARGET", help=TARGET_HELP)
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(fn=cmd_stats)

    s = sub.add_parser("compact", help="store checkpoints as tensor pieces, compressed and delta-encoded",
                       description="Re-cut every file committed since the last compaction: recognised checkpoint "
                       "formats (safetensors, torch.save, .distcp, .npy) into tensor pieces, stored byte-grouped and "
                       "compressed, older pieces as deltas against the next newer piece of the same tensor. Reads return the same "
                       "bytes; the records it replaced are given back at the end of the run (a gc). The daemon also does this "
                       "when idle.",
                       epilog="example: cowfs compact /mnt/ckpt")
    s.add_argument("store", metavar="TARGET", help=TARGET_HELP)
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(fn=cmd_compact)

    s = sub.add_parser("gc", help="reclaim space", description="Delete chunks that no retained version uses and give their space back to the device.",
                       epilog="example: cowfs gc /mnt/ckpt")
    s.add_argument("store", metavar="TARGET", help=TARGET_HELP)
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(fn=cmd_gc)

    s = sub.add_parser("diff", help="what changed between two snapshots",
                       description="Paths added (A), removed (D) and changed (M) from A to B, with sizes and the bytes "
                       "of B that A already holds (shared: stored once). A and B are snapshot names, @live for the "
                       "live tree, or @G for generation G. A file written again with the same bytes is unchanged.",
                       epilog="example: cowfs diff /mnt/ckpt step-1000 @live")
    s.add_argument("store", metavar="TARGET", help=TARGET_HELP)
    s.add_argument("a", metavar="A", help="snapshot name, @live or @GENERATION")
    s.add_argument("b", metavar="B", nargs="?", default="@live", help="snapshot name, @live or @GENERATION (default @live)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(fn=cmd_diff)

    s = sub.add_parser("watch", help="follow commits and snapshots as they happen",
                       description="Print one line (JSON with --json) per committed file version, rename, removal and "
                       "snapshot, as the daemon commits them (pushed, not polled), optionally only under PATH. "
                       "Needs a mounted store; ends on Ctrl-C or when the store is unmounted.",
                       epilog="example: cowfs watch /mnt/ckpt /run1/model.safetensors --json")
    s.add_argument("store", metavar="TARGET", help=TARGET_HELP)
    s.add_argument("path", nargs="?", help="only changes to this path or below it (path inside the store, e.g. /run1)")
    s.add_argument("--json", action="store_true", help="one JSON object per line")
    s.set_defaults(fn=cmd_watch)

    s = sub.add_parser("log", help="versions of a path", description="Every retained version of PATH, newest first.",
                       epilog="example: cowfs log /mnt/ckpt /run1/model.safetensors")
    s.add_argument("store", metavar="TARGET", help=TARGET_HELP)
    s.add_argument("path")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_log)

    add_commands(sub)
    add_remote_commands(sub)

    for name, fn, help_ in (("cat", cmd_cat, "write a file's bytes to stdout"), ("ls", cmd_ls, "list a directory")):
        s = sub.add_parser(name, help=help_, description=help_ + ", live or as of a snapshot or generation.",
                           epilog=f"example: cowfs {name} /mnt/ckpt /run1 --snapshot step-1000")
        s.add_argument("store", metavar="TARGET", help=TARGET_HELP)
        s.add_argument("path")
        g = s.add_mutually_exclusive_group()
        g.add_argument("--snapshot", metavar="NAME", help="as of this snapshot")
        g.add_argument("--generation", metavar="G", type=int, help="as of this generation")
        s.set_defaults(fn=fn)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args))
    except CowfsError as e:
        print(f"cowfs: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("cowfs: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        print(f"cowfs: {e.filename or ''}{': ' if e.filename else ''}{e.strerror or e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
