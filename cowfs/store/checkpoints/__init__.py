"""Checkpoint awareness: training checkpoints found in the tree and snapshotted whole.

Owns HF Trainer state (trainer_state), the rules that say a change completed a checkpoint
(rules), the bounded search for checkpoints as of any generation (walk), the index of
every checkpoint in the snapshots and the live tree (index), snapshots taken on a
checkpoint (snapshot), and which snapshots keep the N best (keep_best). It sits above
`Store` and uses it as the FUSE layer and the CLI do.

May import: store, upkeep, catalog.
"""
