"""The `cowfs remote` commands: set, unset, status, push, fetch, gc, fsck (docs/cli.md)."""
from __future__ import annotations

import argparse
import json
import os
from typing import Any

from .cli_common import TARGET_HELP, progress_bar
from .control import Target
from .units import human_bytes, human_duration, parse_size


def cmd_remote(args: argparse.Namespace) -> int:
    if args.action == "gc":
        return _gc(args)
    if args.action == "fsck":
        return _fsck(args)
    with Target(args.store) as t:
        if args.action == "set":
            creds = None if args.credentials is None else os.path.abspath(args.credentials)
            r = t.call("remote_set", url=args.url, endpoint=args.endpoint, region=args.region,
                       credentials_file=creds, profile=args.profile, create_bucket=args.create_bucket,
                       notify=args.notify, local_limit=_size(args.local_limit), fetch_cache=_size(args.fetch_cache))
            made = " (bucket created)" if r["bucket_created"] else ""
            print(f"remote {r['remote']}{made}: new versions are uploaded in the background while mounted; "
                  f"`cowfs remote push {args.store}` uploads now")
            if args.local_limit is not None:
                print(f"segments beyond {human_bytes(parse_size(args.local_limit))} on the local disk are evicted once they are "
                      "in the bucket, and fetched when read")
        elif args.action == "fetch":
            r = t.call("remote_fetch", progress=progress_bar("fetching"))
            print(f"{r['segments']} evicted segments fetched back ({human_bytes(r['bytes'])}); no limit on the local "
                  f"log now ({human_bytes(r['local_bytes'])} in segment files)")
        elif args.action == "unset":
            r = t.call("remote_unset")
            print("remote removed (the bucket is left as it is)" if r["removed"] else "no remote was set")
        elif args.action == "push":
            r = t.call("remote_push", progress=progress_bar("uploading", human_bytes))
            if args.json:
                print(json.dumps(r, indent=2))
            elif r["skipped"]:
                print(f"nothing new: generation {r['generation']} is already in the bucket")
            else:
                print(f"generation {r['generation']} in the bucket: {r['chunks']} chunks in {r['packs']} packs, "
                      f"{human_bytes(r['bytes'])} uploaded, catalog {human_bytes(r['catalog_bytes'])}, "
                      f"{r['seconds']:.1f} s")
            if r.get("evicted") and not args.json:
                _print_eviction(r["evicted"])
        else:
            _print_status(t.call("remote_status"), args.json)
    return 0


def _size(text: str | None) -> int | None:
    return None if text is None else parse_size(text)


def _print_eviction(e: dict[str, Any]) -> None:
    line = (f"local log {human_bytes(e['local_bytes'])} of {human_bytes(e['limit'])}: {e['segments']} segments "
            f"evicted now ({human_bytes(e['bytes'])}), {e['evicted_total']} kept only in the bucket")
    if e["local_bytes"] > e["limit"] and e["kept"]:
        line += "; over the limit because " + "; ".join(f"{n} segments: {why}" for why, n in e["kept"].items())
    print(line)


def _gc(args: argparse.Namespace) -> int:
    with Target(args.store) as t:
        r = t.call("remote_gc", grace=args.grace, progress=progress_bar("uploading", human_bytes))
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    if r["swept_lists"]:
        swept = (f"swept {r['swept_lists']} doomed lists: {r['deleted_packs']} packs "
                 f"({human_bytes(r['deleted_bytes'])}) deleted, {r['kept_packs']} kept (used again)")
    else:
        swept = "no doomed list due for its sweep"
    waiting = f", {r['waiting_lists']} waiting for their grace period" if r["waiting_lists"] else ""
    print(f"remote gc: generation {r['generation']} in the bucket; {swept}{waiting}")
    if r["doomed_list"]:
        marked = (f"marked {r['marked_packs']} unused packs ({human_bytes(r['marked_bytes'])}) for deletion by a gc "
                  f"after {human_duration(r['grace_seconds'])} ({r['doomed_list']})")
    else:
        marked = "no unused pack older than the grace period to mark"
    aborted = f"; aborted {r['aborted_uploads']} incomplete uploads" if r["aborted_uploads"] else ""
    print(f"remote gc: {marked}{aborted}")
    return 0


def _fsck(args: argparse.Namespace) -> int:
    with Target(args.store) as t:
        r = t.call("remote_fsck", deep=args.deep, progress=progress_bar("reading packs", human_bytes))
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        for line in r["problems"]:
            print(line)
        state = "clean" if r["clean"] else f"{len(r['problems'])} problem(s)"
        deep = f", {r['packs_read']} packs read whole ({human_bytes(r['bytes_read'])})" if args.deep else ""
        gens = ", ".join(map(str, r["catalogs"])) or "none"
        pins = f", {len(r['pins'])} pinned snapshots" if r["pins"] else ""
        print(f"remote fsck: {state}: catalog generations {gens}{pins}, {r['chunks_checked']} chunks they use, "
              f"{r['indexes']} indexes of {r['packs']} packs{deep}")
    return 0 if r["clean"] else 1


def _print_status(s: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(s, indent=2))
        return
    if s["remote"] is None:
        print("no remote set")
        return
    print(f"remote:      {s['remote']}" + (f" at {s['endpoint']}" if s["endpoint"] else ""))
    print(f"uploaded:    generation {s['catalog_generation']} of {s['generation']}")
    doomed = f", {s['doomed_packs']} marked by remote gc" if s.get("doomed_packs") else ""
    print(f"bucket:      {s['chunks']} chunks in {s['packs']} packs, {human_bytes(s['pack_bytes'])} "
          f"({human_bytes(s['uploaded_bytes'])} uploaded by this store{doomed})")
    limit = "no limit" if s["local_limit"] is None else f"limit {human_bytes(s['local_limit'])}"
    print(f"local log:   {human_bytes(s['local_bytes'])} ({limit}), {s['evicted_segments']} segments kept only "
          "in the bucket")
    if s.get("last_error"):
        print(f"last error:  {s['last_error']}")


def add_commands(sub: Any) -> None:
    s = sub.add_parser("remote", help="keep the store's versions in an S3 bucket as well",
                       description="Set, check and run the upload of the store's chunks and catalog to an S3 bucket "
                       "(Ceph RGW, AWS S3 or any S3-compatible engine). Credentials come from AWS_ACCESS_KEY_ID "
                       "and AWS_SECRET_ACCESS_KEY, or from --credentials FILE; they are never written into the store.",
                       epilog="example: cowfs remote set /data/store s3://ckpts/run1 --endpoint http://rgw:7480")
    act = s.add_subparsers(dest="action", required=True, metavar="ACTION")
    c = act.add_parser("set", help="upload to this bucket and prefix from now on",
                       epilog="example: cowfs remote set /data/store s3://ckpts/run1 --endpoint http://rgw:7480")
    c.add_argument("store", metavar="TARGET", help=TARGET_HELP)
    c.add_argument("url", metavar="s3://BUCKET/PREFIX")
    c.add_argument("--endpoint", metavar="URL", help="the S3 endpoint (default: AWS for --region)")
    c.add_argument("--region", help="region name (default us-east-1)")
    c.add_argument("--credentials", metavar="FILE", help="an AWS credentials file outside the store ([default] "
                   "aws_access_key_id, aws_secret_access_key)")
    c.add_argument("--profile", help="its section (default: default)")
    c.add_argument("--create-bucket", action="store_true", help="create the bucket if it does not exist")
    c.add_argument("--notify", metavar="HOST:PORT", help="while mounted, send consumers (cowfs mount s3://...) a notice "
                   "of each new version from this address (PORT 0: any free port)")
    c.add_argument("--local-limit", metavar="SIZE", help="keep at most SIZE of segment files on the local "
                   "disk: older segments already in the bucket are evicted, and fetched when read (default: no limit)")
    c.add_argument("--fetch-cache", metavar="SIZE", help="keep up to SIZE of fetched pieces of evicted "
                   "segments in STORE/cache (default 1G)")
    for name, help_ in (("status", "what the bucket holds of this store"),
                        ("push", "upload what the bucket lacks of the current generation, now"),
                        ("fetch", "fetch every evicted segment back and stop evicting"),
                        ("unset", "stop uploading (nothing is deleted from the bucket)")):
        c = act.add_parser(name, help=help_, epilog=f"example: cowfs remote {name} /mnt/ckpt")
        c.add_argument("store", metavar="TARGET", help=TARGET_HELP)
        if name not in ("unset", "fetch"):
            c.add_argument("--json", action="store_true")
    c = act.add_parser("gc", help="delete packs no catalog of any store sharing the prefix uses (mark, then sweep)",
                       description="Run an upload pass, delete the packs marked by an earlier remote gc at least "
                       "the grace period ago that are still unused, then mark the packs no retained catalog of any "
                       "store sharing the prefix uses (and older than the grace period) for a later remote gc.",
                       epilog="example: cowfs remote gc /mnt/ckpt --grace 2h")
    c.add_argument("store", metavar="TARGET", help=TARGET_HELP)
    c.add_argument("--grace", metavar="DURATION", help="how long marked packs wait before a gc may delete them, "
                   "and how old an unused pack must be to be marked (default 1h, at least 2s; e.g. 30m, 12h)")
    c.add_argument("--json", action="store_true")
    c = act.add_parser("fsck", help="check that the bucket holds every chunk the store's catalogs there use",
                       description="Check the store's catalog objects in the bucket: every chunk their files use "
                       "must be in a pack whose index and object are there; name the paths and versions a missing "
                       "or damaged object affects. Exit status 1 when problems are found.",
                       epilog="example: cowfs remote fsck /mnt/ckpt --deep")
    c.add_argument("store", metavar="TARGET", help=TARGET_HELP)
    c.add_argument("--deep", action="store_true", help="also read every pack holding such a chunk and check its "
                   "bytes, records and index")
    c.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_remote)
