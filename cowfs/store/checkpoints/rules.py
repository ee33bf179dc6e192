"""Which committed changes complete a checkpoint, and what its snapshot is called.

`detect` looks only at an event's kind and path (it runs on the thread that committed
the change, so it must cost nothing): the file whose commit completes a checkpoint in
each framework's save protocol.

  HF Trainer   RUN/checkpoint-N/trainer_state.json (written last), or a directory renamed
               to RUN/checkpoint-N (transformers 4.36-4.37 saved into tmp-checkpoint-N)
  Lightning    RUN/.../NAME.ckpt (one torch.save per checkpoint)
  DCP          CKPT/.metadata (renamed into place or written by the coordinator, after
               every rank's .distcp files)
  DeepSpeed    SAVE_DIR/latest (rank 0 writes the tag of the checkpoint just saved)

Anything inside a `checkpoint-N/` directory other than its trainer_state.json is part of
that Trainer checkpoint (the Trainer's DeepSpeed `latest`, FSDP's DCP `.metadata`) and
completes nothing by itself. Whether the checkpoint really is complete is checked later,
off the commit path, as of the commit's generation (snapshot.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..catalog.events import LINK, RENAME, VERSION, Event
from .trainer_state import CHECKPOINT_DIR, STATE_FILE

TRAINER = "trainer"
LIGHTNING = "lightning"
DCP = "dcp"
DEEPSPEED = "deepspeed"

LIGHTNING_SUFFIX = ".ckpt"
LIGHTNING_LAST = re.compile(r"^last(-v\d+)?$")  # ModelCheckpoint.CHECKPOINT_NAME_LAST, with its version suffix
LIGHTNING_STEP = re.compile(r"(?:^|[-_])step=(\d+)")  # the default filename "{epoch}-{step}" gives epoch=E-step=S
DCP_METADATA = ".metadata"
DEEPSPEED_LATEST = "latest"
MAX_TAG_BYTES = 4096  # a DeepSpeed `latest` holds one tag
TRAILING_NUMBER = re.compile(r"(\d+)$")
RUN_SEPARATOR = ":"  # '/' of the run's path in a snapshot name
MAX_NAME_BYTES = 255


@dataclass(frozen=True)
class Trigger:
    """A change that may have completed a checkpoint."""

    kind: str        # TRAINER, LIGHTNING, DCP or DEEPSPEED
    path: str        # the file whose commit completes it (for a renamed Trainer directory, its trainer_state.json)
    generation: int  # the generation of that change


def _split(path: str) -> tuple[str, str]:
    head, _, name = path.rpartition("/")
    return head, name


def in_trainer_checkpoint(directory: str) -> bool:
    """Whether `directory` is a `checkpoint-N` directory or lies inside one."""
    return any(CHECKPOINT_DIR.match(part) for part in directory.split("/"))


def detect(event: Event) -> Trigger | None:
    """The checkpoint this change may have completed, from its kind and path alone."""
    if event.kind not in (VERSION, RENAME, LINK) or not event.path:
        return None
    parent, name = _split(event.path)
    if event.kind == RENAME and event.size is None:  # a directory (or symlink) moved into place
        if CHECKPOINT_DIR.match(name) and not in_trainer_checkpoint(parent):
            return Trigger(TRAINER, f"{event.path}/{STATE_FILE}", event.generation)
        return None
    if in_trainer_checkpoint(parent):
        ckpt_parent, ckpt_name = _split(parent)
        if name == STATE_FILE and CHECKPOINT_DIR.match(ckpt_name) and not in_trainer_checkpoint(ckpt_parent):
            return Trigger(TRAINER, event.path, event.generation)
        return None
    if is_lightning_file(name):
        return Trigger(LIGHTNING, event.path, event.generation)
    if name == DCP_METADATA:
        return Trigger(DCP, event.path, event.generation)
    if name == DEEPSPEED_LATEST:
        return Trigger(DEEPSPEED, event.path, event.generation)
    return None


# -- names ---------------------------------------------------------------------------


def trailing_step(name: str) -> int | None:
    """N of a name ending in a number (global_step500, step-7, 42), else None."""
    m = TRAILING_NUMBER.search(name)
    return int(m.group(1)) if m else None


def step_label(name: str) -> str:
    """`step-N` for a name ending in a number (global_step500, step-7, 42), else the name."""
    step = trailing_step(name)
    return f"step-{step}" if step is not None else name


def is_lightning_file(name: str) -> bool:
    """Whether a file of this name is a Lightning checkpoint (NAME.ckpt)."""
    return name.endswith(LIGHTNING_SUFFIX) and len(name) > len(LIGHTNING_SUFFIX)


def lightning_step(file_name: str) -> int | None:
    """S of a file named with step=S (epoch=0-step=100.ckpt), else None (last.ckpt)."""
    m = LIGHTNING_STEP.search(file_name[: -len(LIGHTNING_SUFFIX)])
    return int(m.group(1)) if m else None


def lightning_label(file_name: str) -> str:
    """`step-S` for a file named with step=S (epoch=0-step=100.ckpt), else its stem (last)."""
    step = lightning_step(file_name)
    return f"step-{step}" if step is not None else file_name[: -len(LIGHTNING_SUFFIX)]


def deepspeed_tag(data: bytes) -> str | None:
    """The tag a DeepSpeed `latest` file holds (one directory name), or None if it holds none."""
    tag = data.decode(errors="replace").strip()
    return None if not tag or "/" in tag or "\n" in tag or tag in (".", "..") else tag


def lightning_is_last(file_name: str) -> bool:
    return bool(LIGHTNING_LAST.match(file_name[: -len(LIGHTNING_SUFFIX)]))


def run_of(trigger: Trigger, checkpoint: str) -> str:
    """The run a checkpoint belongs to: the directory above it (Lightning: above its
    `checkpoints/` directory; DeepSpeed: the directory holding `latest`), as a path."""
    if trigger.kind in (LIGHTNING, DEEPSPEED):
        run = _split(trigger.path)[0]
        if trigger.kind == LIGHTNING and run.endswith("/checkpoints"):
            run = run[: -len("/checkpoints")]
        return run
    return _split(checkpoint)[0]


def snapshot_name(run: str, label: str) -> str:
    """`RUN@LABEL` with the run's path relative to the mount root and '/' as ':', e.g.
    `exp:run1@step-500` (just LABEL for a checkpoint at the root). A legal snapshot name:
    no '/', no leading '.' or '@' (then '_' is put first), at most 255 bytes (the run is cut
    from the left)."""
    label = label.replace("/", "_").replace("\0", "_")
    parts = [p for p in run.split("/") if p]
    name = f"{RUN_SEPARATOR.join(parts)}@{label}" if parts else label
    if name[0] in ".@":
        name = "_" + name
    while len(name.encode()) > MAX_NAME_BYTES:
        name = "_" + name[2:]
    return name


def name_with_suffix(base: str, taken: set[str]) -> str:
    """`base`, or `base.2`, `base.3`... for a name that exists (a re-save of the same step)."""
    if base not in taken:
        return base
    k = 2
    while f"{base}.{k}" in taken:
        k += 1
    return f"{base}.{k}"


class LightningLast:
    """Lightning's `last.ckpt` (save_last=True) is a second save of the checkpoint saved just
    before it in the same directory: it gets a snapshot of its own only in a directory where
    no step-named `.ckpt` has been seen since the daemon started (save_top_k=0). The
    daemon's one instance is used on its trio thread only."""

    def __init__(self) -> None:
        self._dirs_with_steps: set[str] = set()

    def wanted(self, trigger: Trigger) -> bool:
        if trigger.kind != LIGHTNING:
            return True
        directory, name = _split(trigger.path)
        if not lightning_is_last(name):
            if LIGHTNING_STEP.search(name):
                self._dirs_with_steps.add(directory)
            return True
        return directory not in self._dirs_with_steps


__all__ = ["Trigger", "detect", "snapshot_name", "name_with_suffix", "run_of", "step_label", "lightning_label",
           "trailing_step", "lightning_step", "is_lightning_file", "deepspeed_tag", "in_trainer_checkpoint",
           "LightningLast", "TRAINER", "LIGHTNING", "DCP", "DEEPSPEED"]
