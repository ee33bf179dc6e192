"""Crash test: kill -9 the mount daemon while real checkpoints are being saved, then check.

    python -m tools.crashtest --cycles N [--seed S] [--store DIR] [--keep]   (from the repository root)

Each cycle:

1. A writer process saves real checkpoints in a loop into the mount (MNT/run/), the way
   training code does: (a) torch.save of a ~3 MB model state dict (half of it frozen, so
   chunks dedup) over a fixed `model.pt` (in-place O_TRUNC rewrite; now and then first a
   rollback: one of the last 3 steps' weights again, the bytes of a maybe dead version),
   (b) safetensors save_file to a temporary name + os.replace onto `model.safetensors`,
   (c) an HF-style `checkpoint-N/` directory (model.safetensors, optimizer.pt,
   trainer_state.json last), rotated to keep the newest 2. Before it opens a file it logs
   a `begin` record with the sha256 of the bytes it is about to write; once close() has
   returned it logs `closed`. Records carry a CLOCK_MONOTONIC time and go to a JSON-lines
   file on a non-cowfs path (fsynced each) and to a pipe.
2. Meanwhile the harness takes snapshots (`mkdir MNT/.snapshots/NAME`), records the sha256
   of every file in each one right after the mkdir, and deletes the oldest ones (rmdir)
   beyond --max-snapshots. In some cycles (--mount-gc-prob, and always when the kill
   targets gc) it also sends the daemon `gc` and `prune --keep-name 'c[0-9]*-[0-9]*'
   --keep-history 0` requests (the requests `cowfs gc MNT` / `cowfs prune MNT ...` send):
   prune keeps every harness snapshot but drops the history no snapshot holds, so gc
   really punches and deletes segments while the writer runs.
3. At a random moment (a random delay, or a short random delay after a chosen writer
   event: a file open, a close, a rename, a rotation, a checkpoint mkdir; after a snapshot
   mkdir started; after an in-mount gc/prune request was sent, or after its first progress
   line, i.e. while it punches) it kills the daemon with SIGKILL (pid from STORE/lock),
   kills the writer, and lazily unmounts (fusermount3 -u -z). A daemon that was already
   dead, or that logged a warning or error, is a failure.
4. Unmounted: `cowfs fsck STORE` must exit 0. The history of every file closed in this
   cycle (Store API) must hold each closed version (new contents born in close order) and
   nothing but complete versions (no empty version that is not current). A closed version
   may be missing only if an in-mount prune that could have expired it ran after it was
   replaced and no surviving snapshot holds it. Closed versions not loaded otherwise are
   written out and loaded with torch / safetensors / json. History is expired (most
   cycles) and `cowfs gc` runs (some cycles).
5. Remounted: every path in the live tree must be in a state the writer's log allows (the
   last closed version, or, when the writer had begun the next one, that complete next
   version; a file being created may also be empty; nothing torn, nothing unknown; a rename
   is all or nothing), every non-empty live file must load (torch.load / safetensors
   load_file / json), and every retained snapshot must hold exactly the bytes recorded when
   it was taken. The first time, a snapshot must also match the writer's log at some moment
   while its mkdir ran: every path present or absent as the log allows then, each file the
   version it had then, renames all or nothing. A snapshot whose mkdir or rmdir the kill
   interrupted may exist or not; if it exists it is recorded (and checked) then.

With --overwrite-safetensors the writer also does (d): save_file straight over an existing
`model-direct.safetensors`. safetensors 0.8 writes a `.tmp<random>` sibling, renames it onto
the target and closes it only after the rename; the rename transaction keeps the previous
version until that close (design.md, "Replace-via-rename before close").

One line per cycle, then `K/N recovered`. Exit 0 only when every cycle recovered. The
harness kills only what it started, by pid (its writer and its mount's daemon), and
unmounts its mountpoint, also on Ctrl-C, SIGTERM or failure. Without --workdir/--store
everything lives in a temporary directory that is removed after a fully successful run
(kept with --keep or on failure).

The package, by what each part owns:

    __main__.py, subcommands.py  `python -m tools.crashtest`; the hidden subcommands
                                 `_writer` and `_inspect` the harness runs as its children
    cli.py                       the options; running the harness, cleaning up on any exit
    harness.py                   the run and its cycles (Harness)
    writer.py                    the writer process: what it saves, its JSON-lines log
    writer_process.py            the harness's handle on a writer process
    cycle.py                     kill points; one cycle and its kill (Cycle)
    run_phase.py                 one cycle's run phase: its threads, up to the kill and the unmount
    snapshots.py                 taking, recording and deleting snapshots
    gc_thread.py                 sending in-mount gc/prune/compact requests
    gc_requests.py               those requests as the harness saw them (GcRequest)
    mounting.py                  the harness's mount and its daemon
    oracle.py                    the states the writer's log allows (AllowedStates, ends_at)
    offline.py                   unmounted: fsck, history, expiry, gc (step 4)
    inspect_history.py           the `_inspect` child: history through the Store API
    checks.py                    remounted: live tree, snapshots, loads (step 5)
    report.py                    the cycle lines and the totals
    states.py, errors.py         path states and walk_tree; HarnessError
"""
