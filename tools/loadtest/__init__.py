"""Load test (issue 5): many processes save and read checkpoints through one mount while
snapshots come and go and gc runs; every byte read back is checked.

    python -m tools.loadtest [--procs 8] [--seconds 30] [--seed S] [--max-checkpoints N]
                             [--workdir DIR] [--keep]

It inits a store, mounts it, and forks --procs writer processes. Each writer owns the
directory MNT/wN/ and, until --seconds have passed or it has written --max-checkpoints
checkpoints, picks one operation at a time at random:

* torch.save of a varied state dict (dtypes from bool to float64, 0-d, empty and strided
  tensors, a frozen part that dedups) over model-K.pt: an in-place O_TRUNC rewrite;
* safetensors save_file to a temporary name, then os.replace onto weights-K.safetensors;
  or save_file straight over the target (safetensors' own temp + rename before close);
* an HF-style ckpt-N/ directory (model.safetensors, optimizer.pt, trainer_state.json),
  rotated to keep the newest 2 (rmtree);
* in-place patches of state-K.bin (pwrite at random offsets, also past the end), appends
  to it or to train.log, and deletions of any of these files;
* reads: of its own files, of other writers' committed files, and of recorded snapshots.

Before a writer opens a file it records the sha256 of the bytes it is about to write in its
journal (WORKDIR/journal-wN.jsonl, not on the mount); after close() it re-reads the whole file
and compares. A read of another writer's file must give one of the versions that writer began
(never torn, never foreign). That holds for every read whose open comes after the writer's
open; a read opened *before* an in-place rewrite may see the writer's bytes, as on ext4 (see
docs/design.md), so readers hold a shared flock (on WORKDIR/locks) from open to close and
writers hold it exclusively around their open() only.

Meanwhile the controller (two threads of this process) takes snapshots (alternately
`cowfs snapshot create` and mkdir in .snapshots), hashes every file in each one right away
(each must be a version its writer began, or an empty file being created), deletes the oldest
beyond --keep-snapshots (rmdir, `cowfs snapshot delete` or `cowfs prune --keep-last`, at
random), and every --gc-every seconds runs `cowfs gc` on the mountpoint or on the store.

When every writer has stopped: a final snapshot, the live tree through the mount must equal
every writer's last committed versions, a last gc, `cowfs umount`, `cowfs fsck` must be clean,
and (Store API, unmounted) every remaining snapshot must hold exactly the bytes recorded when
it was taken, and the live tree every writer's last versions.

Prints one line, e.g.
    load: 8 procs, 412 checkpoints written, 1.9 GiB verified, 37 snapshots, 9 gc runs, 0 errors, fsck clean
after the errors (if any, one per line on stderr), and exits 1 on any error. It stops by
itself, also on Ctrl-C or SIGTERM, and always unmounts; it ends only processes it started.
Without --workdir everything lives in a temporary directory removed after a clean run
(kept with --keep or on failure).

The parts:
    errors.py       LoadError, and the cowfs CLI run so that a failure is one
    journal.py      the journals (JSON lines in WORKDIR) and the views other processes read of them
    path_locks.py   the flocks that keep a read from being open across an in-place rewrite's open
    state_dicts.py  the state dicts a writer saves, changing a little every step
    writer.py       a writer process: its operations on its own files
    peer_reads.py   a writer's reads of other writers' files and of recorded snapshots
    controller.py   snapshots, their deletion, prune and gc, next to the writers
    verify.py       tree hashes through the mount and through the Store API, comparisons
    run.py          options, the run from init to fsck, and the summary line
"""
