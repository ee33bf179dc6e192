"""The `cowfs` commands about history: snapshot, restore, prune."""
from __future__ import annotations

import argparse
import json
from typing import Any

from .cli_common import TARGET_HELP, fmt_time, progress_bar
from .control import Target
from .units import human_bytes


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
                print(json.dumps([{"name": s["name"], "generation": s["generation"], "created": fmt_time(s["created_ns"])} for s in snaps], indent=2))
            else:
                print(f"{'NAME':30} {'GENERATION':>10}  CREATED")
                for s in snaps:
                    print(f"{s['name']:30} {s['generation']:>10}  {fmt_time(s['created_ns'])}")
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
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


def cmd_prune(args: argparse.Namespace) -> int:
    with Target(args.store) as t:
        r = t.call("prune", keep_last=args.keep_last, keep_within=args.keep_within, keep_hourly=args.keep_hourly,
                   keep_daily=args.keep_daily, keep_weekly=args.keep_weekly, keep_name=args.keep_name,
                   keep_history=args.keep_history, dry_run=args.dry_run, run_gc=not args.no_gc,
                   progress=None if args.dry_run or args.no_gc else progress_bar("gc"))
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"{'SNAPSHOT':30} {'CREATED':20}  {'ACTION':8} RULES")
    for s in r["snapshots"]:
        print(f"{s['name']:30} {fmt_time(s['created_ns']):20}  {'keep' if s['keep'] else 'remove':8} {', '.join(s['reasons'])}")
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
    c = snap.add_parser("list", help="list snapshots", epilog="example: cowfs snapshot list /mnt/ckpt --json")
    c.add_argument("store", metavar="TARGET", help=TARGET_HELP)
    c.add_argument("--json", action="store_true")
    c = snap.add_parser("delete", help="delete snapshots (space returns at gc)", epilog="example: cowfs snapshot delete /data/store step-500 step-600")
    c.add_argument("store", metavar="TARGET", help=TARGET_HELP)
    c.add_argument("names", nargs="+", metavar="NAME")
    s.set_defaults(fn=cmd_snapshot)

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
    s.add_argument("--to", metavar="DEST", help="restore to this path instead (its directory must exist)")
    s.set_defaults(fn=cmd_restore)

    s = sub.add_parser("prune", help="delete snapshots by keep rules, then reclaim space",
                       description="A snapshot survives if any keep rule keeps it (restic forget semantics); the live tree is never "
                       "touched. History that no snapshot holds is dropped unless --keep-history keeps it; then gc runs unless --no-gc. "
                       "With no keep rule the command refuses.",
                       epilog="example: cowfs prune /mnt/ckpt --keep-last 3 --keep-daily 7 --dry-run")
    s.add_argument("store", metavar="TARGET", help=TARGET_HELP)
    s.add_argument("--keep-last", type=int, default=0, metavar="N", help="keep the N newest snapshots")
    s.add_argument("--keep-within", metavar="DURATION", help="keep snapshots taken within DURATION of the newest (e.g. 2d, 12h)")
    s.add_argument("--keep-hourly", type=int, default=0, metavar="N", help="keep the newest snapshot of each of the last N hours that have one")
    s.add_argument("--keep-daily", type=int, default=0, metavar="N", help="... of each of the last N days (UTC)")
    s.add_argument("--keep-weekly", type=int, default=0, metavar="N", help="... of each of the last N ISO weeks")
    s.add_argument("--keep-name", action="append", metavar="GLOB", help="keep snapshots whose name matches GLOB (repeatable)")
    s.add_argument("--keep-history", metavar="DURATION", help="keep versions the live tree replaced within DURATION (default: drop all history no snapshot holds)")
    s.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    s.add_argument("--no-gc", action="store_true", help="do not reclaim space afterwards")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_prune)
