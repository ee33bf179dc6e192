"""The state dicts a writer saves: like a model in training, a little different every step."""
from __future__ import annotations

import random
from typing import Any


class EvolvingStateDict:
    """A state dict that changes a little every step: a frozen part (dedups across saves),
    a trained part, and a few extra tensors of random dtype and shape.

    torch is imported here, not at the top: the harness imports it once before it forks
    the writers (which share it), and `--help` does not wait for it."""

    def __init__(self, rng: random.Random) -> None:
        import torch

        self.torch = torch
        self.rng = rng
        self.gen = torch.Generator().manual_seed(rng.randrange(1 << 31))
        self.frozen = {f"encoder.{i}.weight": torch.randn(256, 128, generator=self.gen) for i in range(3)}
        self.trained = {
            "decoder.0.weight": torch.randn(128, 256, generator=self.gen),
            "decoder.0.bias": torch.randn(256, generator=self.gen).to(torch.bfloat16),
            "head.weight": torch.randn(64, 128, generator=self.gen).to(torch.float16),
            "embed.ids": torch.randint(0, 50_000, (4096,), generator=self.gen),
        }
        self.step = 0

    def random_tensor(self) -> Any:
        torch = self.torch
        dtype = self.rng.choice([torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
                                 torch.int32, torch.int8, torch.uint8, torch.bool])
        n = self.rng.choice([0, 1, self.rng.randint(2, 64), self.rng.randint(1000, 40_000)])
        shape: tuple[int, ...] = () if n == 1 and self.rng.random() < 0.5 else (n,)
        if n > 64 and self.rng.random() < 0.5:
            shape = (n // 8, 8)
        if dtype.is_floating_point:
            return torch.randn(shape, generator=self.gen).to(dtype)
        if dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=self.gen).bool()
        low = 0 if dtype == torch.uint8 else -100
        return torch.randint(low, 100, shape, generator=self.gen).to(dtype)

    def next(self) -> dict[str, Any]:
        """One training step on: the trained part moves, the frozen part stays."""
        torch = self.torch
        self.step += 1
        for k, v in self.trained.items():
            if v.dtype.is_floating_point:
                self.trained[k] = (v.float() + 0.01 * torch.randn(v.shape, generator=self.gen)).to(v.dtype)
            else:
                self.trained[k] = torch.randint(0, 50_000, v.shape, generator=self.gen)
        sd = {**self.frozen, **self.trained, "step": torch.tensor(self.step)}
        for i in range(self.rng.randint(0, 3)):
            sd[f"extra.{i}"] = self.random_tensor()
        return sd

    def tensors(self) -> dict[str, Any]:
        """For safetensors: contiguous tensors that share no storage."""
        return {k: v.contiguous().clone() for k, v in self.next().items()}
