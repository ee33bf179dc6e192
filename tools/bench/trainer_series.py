"""Build a real checkpoint series with transformers.Trainer on the CPU, for tools/bench/codecs.py.

    python -m tools.bench.trainer_series --dtype bf16 --out /tmp/series-bf16
    python -m tools.bench.trainer_series --dtype fp32 --out /tmp/series-fp32
    python -m tools.bench.trainer_series --dtype fp32 --plain --out /tmp/series-plain-fp32
    python -m tools.bench.trainer_series --dtype bf16 --out /mnt/ckpt/run --save-times t.json --info i.json

(tools/bench/codecs.py builds what it needs itself, through seriescache.ensure; the
compaction benchmark, tools/bench/compaction.py, has Trainer write into a mount.)

Trainer mode: a small GPT-2 built from a GPT2Config in code (no download), trained on
synthetic token data, AdamW (Trainer's default optimizer), lr 5e-5, a checkpoint every
`--save-steps` steps, `--checkpoints` of them, save_total_limit=None. Trainer writes
OUT/checkpoint-20/, OUT/checkpoint-40/, ... each with model.safetensors, optimizer.pt,
scheduler.pt, rng_state.pth, trainer_state.json, training_args.bin, config.json, ...

bf16: the model is cast to bfloat16 before training, so AdamW's exp_avg/exp_avg_sq are
bfloat16 too (no autocast, no fp32 master copy). fp32: fp32 model and fp32 AdamW states.

--plain: no Trainer; the same model and a torch.optim.AdamW, and after every `--save-steps`
steps one torch.save({"model": ..., "optimizer": ...}) to the same file name; each version
is kept in OUT/save-N/checkpoint.pt so the codec benchmark can read them all; with
--one-path every save rewrites OUT/model.pt instead (a store that keeps history keeps them).

--save-times PATH: the seconds of every checkpoint save, as a JSON list: Trainer's whole
`_save_checkpoint` (model, optimizer, scheduler, RNG state, trainer state), or the plain
torch.save up to its close. On a cowfs mount every close commits durably, so these are
durable save times.

When the run is done, OUT/series.json (or --info PATH) describes it (its presence marks a
complete series).

A bench tool: cowfs/ never imports it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset

from .seriescache import MARKER

VOCAB = 8192
SEQ = 64
BATCH = 8


class SyntheticTokens(Dataset):
    """Deterministic token sequences with some structure (a noisy affine walk over the
    vocabulary, Zipf-like steps) so the loss falls and gradients are not pure noise."""

    def __init__(self, n: int, seq: int, vocab: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (n, 1), generator=g)
        u = torch.rand(n, seq - 1, generator=g)
        steps = (1.0 / (u + 1e-3)).floor().long().clamp(max=vocab // 4)  # heavy-tailed
        walk = torch.cumsum(torch.cat([start, steps], dim=1) * 7, dim=1)
        self.ids = (walk % vocab).long()

    def __len__(self) -> int:
        return self.ids.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = self.ids[i]
        return {"input_ids": x, "labels": x.clone()}


def build_model(dtype: str, seed: int) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=256, n_layer=4, n_head=4)
    model = GPT2LMHeadModel(cfg)
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
    return model


def run_trainer(args: argparse.Namespace) -> list[float]:
    from transformers import Trainer, TrainingArguments

    model = build_model(args.dtype, args.seed)
    steps = args.save_steps * args.checkpoints
    data = SyntheticTokens(steps * BATCH, SEQ, VOCAB, args.seed)
    targs = TrainingArguments(
        output_dir=str(args.out),
        max_steps=steps,
        per_device_train_batch_size=BATCH,
        learning_rate=args.lr,
        optim=args.optim,
        lr_scheduler_type=args.scheduler,
        save_strategy="steps",
        save_steps=args.save_steps,
        save_total_limit=None,
        logging_steps=args.save_steps,
        report_to=[],
        use_cpu=True,
        bf16=False,  # no autocast: the bf16 series trains a bf16 model directly
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=args.seed,
    )
    trainer = Trainer(model=model, args=targs, train_dataset=data)
    times: list[float] = []
    save_checkpoint = trainer._save_checkpoint

    def timed_save(*a: object, **kw: object) -> None:  # the instance attribute shadows the method
        t0 = time.perf_counter()
        save_checkpoint(*a, **kw)
        times.append(time.perf_counter() - t0)

    trainer._save_checkpoint = timed_save  # type: ignore[method-assign]
    trainer.train()
    opt = trainer.optimizer
    state_dtypes = sorted({str(v.dtype) for s in opt.state.values() for v in s.values()
                           if isinstance(v, torch.Tensor) and v.numel() > 1})
    print(f"optimizer {type(opt).__name__} state dtypes {state_dtypes}", file=sys.stderr)
    return times


def run_plain(args: argparse.Namespace) -> list[float]:
    model = build_model(args.dtype, args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = SyntheticTokens(args.save_steps * args.checkpoints * BATCH, SEQ, VOCAB, args.seed)
    model.train()
    step = 0
    times: list[float] = []
    for k in range(args.checkpoints):
        for _ in range(args.save_steps):
            batch = data.ids[step * BATCH:(step + 1) * BATCH]
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
        if args.one_path:
            path = args.out / "model.pt"
        else:
            path = args.out / f"save-{step}" / "checkpoint.pt"
            path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, path)
        times.append(time.perf_counter() - t0)
        print(f"save {k + 1}/{args.checkpoints} step {step} loss {loss.item():.3f}", file=sys.stderr)
    return times


def describe(out: Path, saves: int) -> dict[str, object]:
    versions = sorted((p for p in out.iterdir() if p.is_dir() and p.name.split("-")[-1].isdigit()),
                      key=lambda p: int(p.name.split("-")[-1]))
    last = versions[-1] if versions else out  # --one-path: the one file, as last saved
    files = {}
    for f in sorted(last.rglob("*")):
        if f.is_file():
            files[str(f.relative_to(last))] = f.stat().st_size
    names = [v.name for v in versions] or [f"save-{k + 1}" for k in range(saves)]
    return {"versions": names, "last_version_files": files}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--plain", action="store_true", help="plain torch.save series instead of Trainer")
    ap.add_argument("--one-path", action="store_true", help="with --plain: every save rewrites OUT/model.pt")
    ap.add_argument("--save-times", type=Path, help="write the seconds of each checkpoint save here (JSON list)")
    ap.add_argument("--info", type=Path, help=f"where the description goes (default OUT/{MARKER})")
    ap.add_argument("--save-steps", type=int, default=20)
    ap.add_argument("--checkpoints", type=int, default=10)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--optim", default="adamw_torch_fused", help="Trainer optim name (Trainer's default)")
    ap.add_argument("--scheduler", default="linear", help="Trainer lr_scheduler_type (Trainer's default: linear decay to 0)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    if args.out.exists() and any(args.out.iterdir()):
        ap.error(f"{args.out} is not empty")
    if args.one_path and not args.plain:
        ap.error("--one-path needs --plain (Trainer writes checkpoint-N/ directories)")
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    t0 = time.perf_counter()
    times = (run_plain if args.plain else run_trainer)(args)
    if args.save_times:
        args.save_times.write_text(json.dumps(times) + "\n")
    info = describe(args.out, len(times))
    info.update(seconds=round(time.perf_counter() - t0, 1), dtype=args.dtype, plain=args.plain,
                one_path=args.one_path, torch=torch.__version__)
    text = json.dumps(info, indent=1)
    (args.info or args.out / MARKER).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
