"""A GPT-2-shaped transformer defined here (nothing is downloaded), LoRA adapters, a training step.

`--full` uses the GPT-2 small shape (12 layers, 768 wide, 50257 tokens, 1024 positions:
about 124M parameters, the output head tied to the token embedding as in GPT-2);
quick mode uses a narrower, shallower model of the same shape.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    vocab: int
    positions: int
    dim: int
    layers: int
    heads: int

    @property
    def name(self) -> str:
        return f"gpt2-shaped {self.layers}x{self.dim}, vocab {self.vocab}"


GPT2_SMALL = GPTConfig(vocab=50257, positions=1024, dim=768, layers=12, heads=12)
QUICK = GPTConfig(vocab=16384, positions=256, dim=384, layers=6, heads=6)


class LoRALinear(nn.Module):
    """y = base(x) + (x A^T B^T) * alpha / r, with the base frozen; merge() gives base + B A * scale."""

    def __init__(self, base: nn.Linear, rank: int = 8, alpha: float = 16.0) -> None:
        super().__init__()
        self.base = base
        self.scale = alpha / rank
        self.a = nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))
        self.b = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + F.linear(F.linear(x, self.a), self.b) * self.scale

    def merged_weight(self) -> torch.Tensor:
        return self.base.weight + (self.b @ self.a) * self.scale


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.ln_1 = nn.LayerNorm(cfg.dim)
        self.c_attn: nn.Module = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.attn_proj = nn.Linear(cfg.dim, cfg.dim)
        self.ln_2 = nn.LayerNorm(cfg.dim)
        self.c_fc = nn.Linear(cfg.dim, 4 * cfg.dim)
        self.mlp_proj = nn.Linear(4 * cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.dim)
        self.wpe = nn.Embedding(cfg.positions, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.dim)
        self.head_grad_to_embedding = True  # False: the tied head does not train the embedding
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1])
        h = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            h = block(h)
        head = self.wte.weight if self.head_grad_to_embedding else self.wte.weight.detach()
        return F.linear(self.ln_f(h), head)  # tied head, as in GPT-2

    def add_lora(self, last_layers: int, rank: int = 8) -> list[nn.Parameter]:
        """Freeze everything, wrap c_attn of the last layers in LoRA; returns the adapter parameters."""
        for p in self.parameters():
            p.requires_grad_(False)
        params: list[nn.Parameter] = []
        for block in self.blocks[-last_layers:]:
            lora = LoRALinear(block.c_attn, rank)  # type: ignore[arg-type]
            block.c_attn = lora
            params += [lora.a, lora.b]
        return params

    def merged_state_dict(self) -> dict[str, torch.Tensor]:
        """The plain GPT state dict with every LoRA adapter merged into its base weight."""
        out: dict[str, torch.Tensor] = {}
        for name, t in self.state_dict().items():
            if ".c_attn.a" in name or ".c_attn.b" in name:
                continue
            out[name.replace(".c_attn.base.", ".c_attn.")] = t
        for i, block in enumerate(self.blocks):
            if isinstance(block.c_attn, LoRALinear):
                out[f"blocks.{i}.c_attn.weight"] = block.c_attn.merged_weight().detach()
        return out


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def train_steps(model: GPT, opt: torch.optim.Optimizer, steps: int, batch: int, seq: int,
                tokens: torch.Tensor | None = None) -> float:
    """`steps` optimizer steps of next-token prediction on random token data.
    `tokens`: draw only these token ids (so only their embedding rows get a gradient)."""
    loss = torch.tensor(0.0)
    for _ in range(steps):
        if tokens is None:
            x = torch.randint(0, model.cfg.vocab, (batch, seq + 1))
        else:
            x = tokens[torch.randint(0, len(tokens), (batch, seq + 1))]
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return float(loss.detach())
