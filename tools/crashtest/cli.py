"""The options of `python -m tools.crashtest`, and running the harness so that what it
started is stopped and unmounted also on Ctrl-C, SIGTERM or failure."""
from __future__ import annotations

import argparse
import shutil
import signal
import sys
import traceback
from types import FrameType

from cowfs.store.log.layout import DEFAULT_DEVICE, DEVICES

from .errors import HarnessError
from .harness import Harness


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tools.crashtest",
                                 description="kill -9 the cowfs daemon while checkpoints are saved; check recovery",
                                 epilog="example: python -m tools.crashtest --cycles 100 --seed 7")
    ap.add_argument("--cycles", type=int, required=True, help="number of kill/recover cycles")
    ap.add_argument("--seed", type=int, help="random seed (default: random, printed)")
    ap.add_argument("--store", help="store directory: must not exist or be empty (default: in the work dir)")
    ap.add_argument("--workdir", help="directory for the mountpoint, logs (and store); never removed")
    ap.add_argument("--keep", action="store_true", help="keep the temporary work dir (store, logs) after success")
    ap.add_argument("--device", default=DEFAULT_DEVICE, choices=DEVICES)
    ap.add_argument("--segment-size", default="4M", help="small segments: rotations happen during the run")
    ap.add_argument("--max-snapshots", type=int, default=6, help="older snapshots are deleted (rmdir) beyond this")
    ap.add_argument("--max-run", type=float, default=3.0, help="longest writer run before the kill, seconds")
    ap.add_argument("--gc-prob", type=float, default=0.3, help="chance of a `cowfs gc` between cycles (unmounted)")
    ap.add_argument("--mount-gc-prob", type=float, default=0.5,
                    help="chance of in-mount gc/prune requests while the writer runs (always when the kill targets gc)")
    ap.add_argument("--stop-on-failure", action="store_true")
    ap.add_argument("--overwrite-safetensors", action="store_true",
                    help="also (d): safetensors save_file straight over run/model-direct.safetensors each step")
    args = ap.parse_args(argv)
    if args.cycles < 1:
        ap.error("--cycles must be at least 1")
    return args


def on_term(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_harness(h: Harness) -> int:
    """h.run(), then h.cleanup() whatever happened (a second Ctrl-C must not skip it)."""
    code = 1
    try:
        code = h.run()
    except KeyboardInterrupt:
        print("crashtest: interrupted; cleaning up", flush=True)
        code = 130
    except HarnessError as e:
        print(f"crashtest: harness error: {e}", flush=True)
        code = 2
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        code = 2
    finally:
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            h.cleanup()
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    return code


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, on_term)
    h = Harness(args)
    code = run_harness(h)
    if code == 0 and h.own_work and not args.keep:
        shutil.rmtree(h.work, ignore_errors=True)
    else:
        print(f"crashtest: store and logs kept in {h.work}" + (f" (store {h.store})" if args.store else ""), flush=True)
    return code
