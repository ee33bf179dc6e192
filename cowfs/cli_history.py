"""The `cowfs` commands about history: snapshot, checkpoints, restore, prune."""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from .cli_common import TARGET_HELP, fmt_time, progress_bar
from .control import Target
from .errors import InvalidArgument
from .units import human_bytes

MAX_METRICS_SHOWN = 4
HIDDEN_METRICS = ("_runtime", "_per_second", "learning_rate", "grad_norm", "total_flos")


def _shown_metrics(metrics: dict[str, float], first: str | None = None) -> str:
    """A few metrics for a table: `first`, then eval_* and loss-like ones, no timings."""
    keys = [k for k in metrics if not k.endswith(HIDDEN_METRICS) and not k.startswith(HIDDEN_METRICS)]
    keys.sort(key=lambda k: (k != first, not k.startswith("eval_"), "loss" not in k, k))
    return " ".join(f"{k}={metrics[k]:.4g}" for k in keys[:MAX_METRICS_SHOWN])


def _epoch(epoch: float | None) -> str:
    return "-" if epoch is None else f"{epoch:.2f}"


def _snapshot_row(s: dict[str, Any]) -> dict[str, Any]:
    row = {"name": s["name"], "generation": s["generation"], "created": fmt_time(s["created_ns"])}
    if "checkpoint" in s:
        row["checkpoint"], row["checkpoints"] = s["checkpoint"], s["checkpoints"]
    return row


def cmd_snapshot(args: argparse.Namespace) -> int:
    with Target(args.store) as t:
        if args.action == "create":
            snap = t.call("snapshot_create", name=args.name)
            print(f"snapshot {snap['name']} at generation {snap['generation']}")
        elif args.action == "delete":
            for name in t.call("snapshot_delete", names=args.names):
                print(f"deleted snapshot {name}")
        else:
            snaps = t.call("snapshot_list")
            if args.json:
                print(json.dumps([_snapshot_row(s) for s in snaps], indent=2))
                return 0
            width = max([30, *(len(s["name"]) for s in snaps)])
            print(f"{'NAME':{width}} {'GENERATION':>10}  {'CREATED':20}  CHECKPOINT")
            for s in snaps:
                c = s.get("checkpoint")
                what = "-" if c is None else (f"{c['path']}: step {c['step']}, epoch {_epoch(c['epoch'])}"
                                              f"{', ' + _shown_metrics(c['metrics']) if c['metrics'] else ''}")
                more = len(s.get("checkpoints") or []) - 1
                print(f"{s['name']:{width}} {s['generation']:>10}  {fmt_time(s['created_ns']):20}  {what}"
                      f"{f' (+{more} more)' if more > 0 else ''}")
    return 0


RESTORE_HINTS = 5  # restore commands printed under the table


def _restore_command(store: str, c: dict[str, Any]) -> str | None:
    """The `cowfs restore` that puts a checkpoint back into the live tree (None: only the live tree has it)."""
    if not c["snapshot"]:
        return None
    return " ".join(["cowfs restore", *map(shlex.quote, (store, c["snapshot_path"], "--snapshot", c["snapshot"]))])


def cmd_checkpoints(args: argparse.Namespace) -> int:
    with Target(args.store) as t:
        r = t.call("checkpoints", path=args.path, sort=args.sort)
    found = r["checkpoints"]
    if r["truncated"]:
        print("cowfs: warning: a tree had too many directories to search whole; give a PATH to narrow it",
              file=sys.stderr)
    if args.json:
        print(json.dumps([{**{k: v for k, v in c.items() if k != "saved_ns"}, "saved": fmt_time(c["saved_ns"]),
                           "restore": _restore_command(args.store, c)} for c in found], indent=2))
        return 0
    if not found:
        print(f"no complete checkpoint (HF Trainer checkpoint-N/, Lightning .ckpt, DCP .metadata, DeepSpeed latest) "
              f"under {args.path} in any snapshot or the live tree")
        return 0
    first = None
    if args.sort:
        first = args.sort.rpartition(":")[0] if args.sort.endswith((":min", ":max")) else args.sort
    rows = [("-" if c["step"] is None else str(c["step"]), _epoch(c["epoch"]), c["kind"], fmt_time(c["saved_ns"]),
             c["snapshot"] or "-", (c["snapshot_path"] or c["path"]) + ("/" if c["type"] == "dir" else ""),
             "live" if c["live"] else "-", _shown_metrics(c["metrics"], first))
            for c in found]
    head = ("STEP", "EPOCH", "KIND", "SAVED", "SNAPSHOT", "PATH", "LIVE", "METRICS")
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    for row in (head, *rows):
        cells = [cell.rjust(w) if i < 2 else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        print("  ".join(cells).rstrip())
    gone = [c for c in found if not c["live"] and c["snapshot"]]
    if gone:
        print("\nput one back into the live tree" + (f" (then resume_from_checkpoint=<mountpoint>{gone[0]['snapshot_path']})"
                                                     if gone[0]["kind"] == "trainer" else "") + ":")
        for c in gone[:RESTORE_HINTS]:
            print(f"  {_restore_command(args.store, c)}")
        if len(gone) > RESTORE_HINTS:
            print(f"  ({len(gone) - RESTORE_HINTS} more: see --json, key \"restore\")")
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    if args.into is not None:
        return _restore_into(args)
    with Target(args.store) as t:
        r = t.call("restore", path=args.path, snapshot=args.snapshot, generation=args.generation, to=args.to)
    source = f"snapshot {args.snapshot}" if args.snapshot else f"generation {args.generation}"
    if r["kind"] == "dir":
        print(f"restored {args.path}/ as of {source} to {r['path']}/ ({r['files']} files, {human_bytes(r['size'])}, "
              f"generation {r['generation']}): made whole in one transaction, no bytes copied")
    else:
        print(f"restored {args.path} as of {source} to {r['path']} ({r['size']} bytes, generation {r['generation']}); "
              "the replaced version stays in the history")
    return 0


def _restore_into(args: argparse.Namespace) -> int:
    from .copy_out import copy_out, mountpoint_of

    if args.snapshot is None:
        raise InvalidArgument("--into copies out of a snapshot: give --snapshot NAME")
    mnt = mountpoint_of(args.store)
    done = copy_out(mnt, args.snapshot, args.path, Path(args.into))
    print(f"restored {args.path} as of snapshot {args.snapshot} into {Path(args.into).absolute()} ({done.files} files, "
          f"{human_bytes(done.bytes)}), read through {mnt} and checked; each file fsynced, the directory renamed "
          "into place last")
    return 0


def _keep_best(pairs: list[list[str]] | None) -> list[list[Any]] | None:
    if not pairs:
        return None
    out: list[list[Any]] = []
    for spec, n in pairs:
        if not n.isdigit():
            raise InvalidArgument(f"--keep-best {spec} {n}: N must be a whole number")
        out.append([spec, int(n)])
    return out


def cmd_prune(args: argparse.Namespace) -> int:
    with Target(args.store) as t:
        r = t.call("prune", keep_last=args.keep_last, keep_within=args.keep_within, keep_hourly=args.keep_hourly,
                   keep_daily=args.keep_daily, keep_weekly=args.keep_weekly, keep_name=args.keep_name,
                   keep_history=args.keep_history, dry_run=args.dry_run, run_gc=not args.no_gc,
                   keep_best=_keep_best(args.keep_best),
                   progress=None if args.dry_run or args.no_gc else progress_bar("gc"))
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    width = max([30, *(len(s["name"]) for s in r["snapshots"])])
    print(f"{'SNAPSHOT':{width}} {'CREATED':20}  {'ACTION':8} RULES")
    for s in r["snapshots"]:
        print(f"{s['name']:{width}} {fmt_time(s['created_ns']):20}  {'keep' if s['keep'] else 'remove':8} "
              f"{', '.join(s['reasons'])}")
    kept = sum(s["keep"] for s in r["snapshots"])
    if r["dry_run"]:
        print(f"dry run: would keep {kept}, remove {len(r['snapshots']) - kept}; nothing changed")
    else:
        print(f"kept {kept}, removed {len(r['snapshots']) - kept}; dropped {r['history_rows_dropped']} history rows no snapshot holds")
        if r["gc"]:
            print(f"gc: {human_bytes(r['gc']['bytes_freed'])} freed on the device ({human_bytes(r['gc']['physical_bytes'])} in use)")
    return 0


def add_commands(sub: Any) -> None:
    """The parsers of these commands, on the `cowfs` command's subparsers."""
    s = sub.add_parser("snapshot", help="create, list or delete snapshots", description="Snapshots pin the whole tree as of now.",
                       epilog="example: cowfs snapshot create /data/store step-1000")
    snap = s.add_subparsers(dest="action", required=True, metavar="ACTION")
    c = snap.add_parser("create", help="snapshot everything committed", epilog="example: cowfs snapshot create /data/store step-1000")
    c.add_argument("store", metavar="TARGET", help=TARGET_HELP)
    c.add_argument("name", help="no '/', must not start with '.' or '@'")
    c = snap.add_parser("list", help="list snapshots, with the HF Trainer checkpoint each holds (step, epoch, metrics)",
                        epilog="example: cowfs snapshot list /mnt/ckpt --json")
    c.add_argument("store", metavar="TARGET", help=TARGET_HELP)
    c.add_argument("--json", action="store_true")
    c = snap.add_parser("delete", help="delete snapshots (space returns at gc)", epilog="example: cowfs snapshot delete /data/store step-500 step-600")
    c.add_argument("store", metavar="TARGET", help=TARGET_HELP)
    c.add_argument("names", nargs="+", metavar="NAME")
    s.set_defaults(fn=cmd_snapshot)

    s = sub.add_parser("checkpoints", help="every complete checkpoint in any snapshot or the live tree",
                       description="Every complete checkpoint under PATH in any snapshot or the live tree: HF Trainer "
                       "(checkpoint-N/ with its trainer_state.json), Lightning (NAME.ckpt), torch.distributed.checkpoint "
                       "(a directory with .metadata), DeepSpeed (the tag directory its latest names). Each once (the "
                       "same save in many snapshots is one), newest save first, with its kind, its step (Trainer: "
                       "trainer_state.json; others: the number in the name, if any), epoch and metrics (Trainer only: "
                       "no torch file is read) and the snapshot and cowfs restore command to get it back.",
                       epilog="example: cowfs checkpoints /mnt/ckpt /run1 --sort eval_loss")
    s.add_argument("store", metavar="TARGET", help=TARGET_HELP)
    s.add_argument("path", nargs="?", default="/", help="only checkpoints under this path (path inside the store, default /)")
    s.add_argument("--sort", metavar="METRIC[:min|max]",
                   help="best first by this HF Trainer metric (names containing 'loss' are better lower; others need :min "
                   "or :max); checkpoints without it (every Lightning, DCP and DeepSpeed one) come last, newest first")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(fn=cmd_checkpoints)

    s = sub.add_parser("restore", help="make an old file or directory current again",
                       description="Make PATH as of a snapshot or generation current again (at --to DEST if given). "
                       "A file becomes a new version (the history is kept); a directory, e.g. an HF Trainer "
                       "checkpoint-N/, is made anew whole in one transaction (DEST must not exist). No bytes are copied.",
                       epilog="example: cowfs restore /mnt/ckpt /run1/checkpoint-500 --snapshot run1@step-500")
    s.add_argument("store", metavar="TARGET", help=TARGET_HELP)
    s.add_argument("path")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--snapshot", metavar="NAME")
    g.add_argument("--generation", metavar="G", type=int)
    where = s.add_mutually_exclusive_group()
    where.add_argument("--to", metavar="DEST", help="restore to this path instead (its directory must exist)")
    where.add_argument("--into", metavar="DIR",
                       help="copy it out of the snapshot, through the mount, to DIR on any file system (DIR must not "
                       "exist; made whole or not at all): how to restore from a read-only mount, such as a "
                       "consumer's or the union of a job's stores")
    s.set_defaults(fn=cmd_restore)

    s = sub.add_parser("prune", help="delete snapshots by keep rules, then reclaim space",
                       description="A snapshot survives if any keep rule keeps it (restic forget semantics); the live tree is never "
                       "touched. History that no snapshot holds is dropped unless --keep-history keeps it; then gc runs unless --no-gc. "
                       "With no keep rule the command refuses.",
                       epilog="example: cowfs prune /mnt/ckpt --keep-last 3 --keep-best eval_loss 2 --dry-run")
    s.add_argument("store", metavar="TARGET", help=TARGET_HELP)
    s.add_argument("--keep-last", type=int, default=0, metavar="N", help="keep the N newest snapshots")
    s.add_argument("--keep-within", metavar="DURATION", help="keep snapshots taken within DURATION of the newest (e.g. 2d, 12h)")
    s.add_argument("--keep-hourly", type=int, default=0, metavar="N", help="keep the newest snapshot of each of the last N hours that have one")
    s.add_argument("--keep-daily", type=int, default=0, metavar="N", help="... of each of the last N days (UTC)")
    s.add_argument("--keep-weekly", type=int, default=0, metavar="N", help="... of each of the last N ISO weeks")
    s.add_argument("--keep-name", action="append", metavar="GLOB", help="keep snapshots whose name matches GLOB (repeatable)")
    s.add_argument("--keep-best", nargs=2, action="append", metavar=("METRIC[:min|max]", "N"),
                   help="keep a snapshot holding each of the N best HF Trainer checkpoints by METRIC (from "
                   "trainer_state.json; names containing 'loss' are better lower, others need :min or :max; repeatable); "
                   "Lightning, DCP and DeepSpeed checkpoints have no metrics and are ignored")
    s.add_argument("--keep-history", metavar="DURATION", help="keep versions the live tree replaced within DURATION (default: drop all history no snapshot holds)")
    s.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    s.add_argument("--no-gc", action="store_true", help="do not reclaim space afterwards")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_prune)
