"""Checkpoint series from real training loops on the CPU.

Each workload owns a model and an optimizer, trains a few steps between
checkpoints (`advance`) and then says what a checkpoint holds: `flat()`, the
tensors by name (what safetensors saves, and what the changed fraction is
counted on), and `torch_object()`, what torch.save saves. The HF workload
writes a whole `checkpoint-N/` directory instead (see savers.save_hf).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from .models import GPT, GPTConfig, param_count, train_steps


@dataclass(frozen=True)
class Scale:
    """How hard each workload trains between checkpoints."""
    steps: int  # optimizer steps between two checkpoints
    batch: int
    seq: int
    frozen_trained_layers: int  # frozen-backbone: how many last blocks train
    lora_layers: int
    sparse_rows_fraction: float  # sparse-embedding: share of the vocabulary the data uses


def flat_optimizer(opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {}
    for idx, state in opt.state_dict()["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                out[f"optimizer.{idx}.{key}"] = value.contiguous()
    return out


class Workload:
    name = ""
    description = ""
    hf = False  # writes a checkpoint-N/ directory instead of one file

    def __init__(self, cfg: GPTConfig, scale: Scale, seed: int) -> None:
        torch.manual_seed(seed)
        self.scale = scale
        self.model = GPT(cfg)
        self.step = 0
        self.loss = float("nan")
        self.opt = self.configure()

    def configure(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.model.parameters(), lr=1e-4)

    def tokens(self) -> torch.Tensor | None:
        return None

    def advance(self) -> None:
        s = self.scale
        self.loss = train_steps(self.model, self.opt, s.steps, s.batch, s.seq, self.tokens())
        self.step += s.steps

    def model_tensors(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().contiguous() for k, v in self.model.state_dict().items()}

    def flat(self) -> dict[str, torch.Tensor]:
        return self.model_tensors()

    def torch_object(self) -> Any:
        return self.flat()


class FullModel(Workload):
    name = "full-model"
    description = "full fine-tune (AdamW, every parameter), model weights only, fp32"


class FullAdamW(Workload):
    name = "full-adamw"
    description = "full fine-tune, model + AdamW state (torch.save of {model, optimizer})"

    def flat(self) -> dict[str, torch.Tensor]:
        return {**{f"model.{k}": v for k, v in self.model_tensors().items()}, **flat_optimizer(self.opt)}

    def torch_object(self) -> Any:
        return {"model": self.model_tensors(), "optimizer": self.opt.state_dict()}


class FrozenBackbone(Workload):
    name = "frozen-backbone"
    description = "backbone frozen, the last blocks and the final norm trained; model weights"

    def configure(self) -> torch.optim.Optimizer:
        for p in self.model.parameters():
            p.requires_grad_(False)
        trained = [p for b in self.model.blocks[-self.scale.frozen_trained_layers:] for p in b.parameters()]
        trained += list(self.model.ln_f.parameters())
        for p in trained:
            p.requires_grad_(True)
        self.model.head_grad_to_embedding = False  # the tied embedding is part of the backbone
        return torch.optim.AdamW(trained, lr=1e-4)


class SparseEmbedding(Workload):
    name = "sparse-embedding"
    description = "only the token embedding trains (SGD), on data using a small part of the vocabulary"

    def configure(self) -> torch.optim.Optimizer:
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.model.wte.weight.requires_grad_(True)
        self.model.head_grad_to_embedding = False  # gradient only through the looked-up rows
        n = max(1, int(self.model.cfg.vocab * self.scale.sparse_rows_fraction))
        self._tokens = torch.randperm(self.model.cfg.vocab)[:n]
        return torch.optim.SGD([self.model.wte.weight], lr=0.1)

    def tokens(self) -> torch.Tensor | None:
        return self._tokens


class LoRAMerged(Workload):
    name = "lora-merged"
    description = "LoRA (rank 8) on the attention input projection of the last blocks; merged weights saved"

    def configure(self) -> torch.optim.Optimizer:
        params = self.model.add_lora(self.scale.lora_layers)
        self.model.head_grad_to_embedding = False
        return torch.optim.AdamW(params, lr=1e-3)

    def model_tensors(self) -> dict[str, torch.Tensor]:
        return {k: v.contiguous() for k, v in self.model.merged_state_dict().items()}


class Bf16Weights(Workload):
    name = "bf16"
    description = "full fine-tune, weights saved in bf16"

    def flat(self) -> dict[str, torch.Tensor]:
        return {k: v.to(torch.bfloat16) for k, v in self.model_tensors().items()}


class HFRotation(FrozenBackbone):
    name = "hf-rotation"
    description = ("HF-Trainer-like checkpoint-N/ (model.safetensors, optimizer.pt, scheduler.pt, "
                   "rng_state.pth, trainer_state.json), last blocks trained, save_total_limit=2")
    hf = True

    def flat(self) -> dict[str, torch.Tensor]:
        return {**{f"model.{k}": v for k, v in self.model_tensors().items()}, **flat_optimizer(self.opt)}


WORKLOADS: dict[str, Callable[[GPTConfig, Scale, int], Workload]] = {
    w.name: w for w in (FullModel, FullAdamW, FrozenBackbone, SparseEmbedding, LoRAMerged, Bf16Weights, HFRotation)
}


def changed_bytes(prev: dict[str, torch.Tensor] | None, cur: dict[str, torch.Tensor]) -> tuple[int, int]:
    """(bytes of elements that differ from `prev`, total bytes) over the tensors of `cur`."""
    total = changed = 0
    for name, t in cur.items():
        nbytes = t.numel() * t.element_size()
        total += nbytes
        old = None if prev is None else prev.get(name)
        if old is None or old.shape != t.shape or old.dtype != t.dtype:
            changed += nbytes
        else:
            changed += int((old != t).sum()) * t.element_size()
    return changed, total


def copy_flat(flat: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in flat.items()}


__all__ = ["Scale", "Workload", "WORKLOADS", "changed_bytes", "copy_flat", "param_count"]
