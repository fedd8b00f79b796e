"""The GPT in the course's three variants: vanilla (a learned position table), perceiver (2023 handout: the middle
blocks run on a short learned bottleneck) and rope (2024 handout: rotary embeddings instead of the position table).

Parameter names are the handout's, so a `state_dict` loads strictly into the handout model and back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention import CausalCrossAttention, CausalSelfAttention, Dropout, KVCache

VARIANTS = ("vanilla", "perceiver", "rope")


@dataclass
class GPTConfig:
    """Model hyperparameters; defaults are the handout's."""

    vocab_size: int = 256
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 8
    n_embd: int = 256
    embd_pdrop: float = 0.1
    resid_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    variant: str = "vanilla"
    bottleneck_dim: int = 32  # the perceiver's bottleneck length m

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")


def add_sublayers(block: nn.Module, config: GPTConfig, attn_class: type, length: int, **options: bool) -> None:
    """Give `block` the handout's sublayers in its order: ln1, ln2, attn over `length` positions, a GELU mlp."""
    block.ln1 = nn.LayerNorm(config.n_embd)
    block.ln2 = nn.LayerNorm(config.n_embd)
    block.attn = attn_class(config.n_embd, config.n_head, length, config.attn_pdrop, config.resid_pdrop, **options)
    block.mlp = nn.Sequential(
        nn.Linear(config.n_embd, 4 * config.n_embd),
        nn.GELU(),
        nn.Linear(4 * config.n_embd, config.n_embd),
        Dropout(config.resid_pdrop),
    )


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln1(x)), then + mlp(ln2(x)). (B, T, C) -> (B, T, C)."""

    def __init__(self, config: GPTConfig, length: int):
        super().__init__()
        add_sublayers(self, config, CausalSelfAttention, length, rope=config.variant == "rope")

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), cache)
        return x + self.mlp(self.ln2(x))


class DownProjectBlock(nn.Module):
    """Cross-attention from a learned basis C (1, m, C) onto the unnormalised input, as in the handout:
    (B, T, C) -> (B, min(m, T), C), bottleneck position i attending to inputs <= i (so for T < m only T are
    computed)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.C = nn.Parameter(torch.empty(1, config.bottleneck_dim, config.n_embd))
        nn.init.xavier_uniform_(self.C)
        add_sublayers(self, config, CausalCrossAttention, config.block_size)

    def forward(self, x_input: torch.Tensor, start: int = 0, cache: KVCache | None = None) -> torch.Tensor:
        """With a cache: new inputs (B, T, C) at positions start.. -> the bottleneck positions they complete."""
        m = self.C.size(1)
        C = self.C[:, min(start, m) : min(start + x_input.size(1), m)].expand(x_input.size(0), -1, -1)
        x = C + self.attn(x_input, self.ln1(C), cache, min(start, m))
        return x + self.mlp(self.ln2(x))


class UpProjectBlock(nn.Module):
    """Cross-attention from the inputs onto the bottleneck, as in the handout: (B, m, C), (B, T, C) -> (B, T, C).
    Input position i attends to bottleneck positions <= i."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        add_sublayers(self, config, CausalCrossAttention, config.block_size)

    def forward(self, y: torch.Tensor, x_input: torch.Tensor, start: int = 0, cache: KVCache | None = None):
        """With a cache, y (B, T', C) holds only the bottleneck positions that x_input (B, T, C) completed."""
        x = x_input + self.attn(self.ln1(y), x_input, cache, start)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Character-level GPT: forward(idx (B, T), targets (B, T) or None) -> (logits (B, T, V), loss or None), a
    cross-entropy that ignores PAD (id 0). Any T up to block_size gives the same logits for its positions. With
    `caches` (new_caches), idx holds each row's next T tokens."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        if config.variant != "rope":
            # Zero-initialised, as in the handout (minGPT).
            self.pos_emb = nn.Parameter(torch.zeros(1, config.block_size, config.n_embd))
        self.drop = Dropout(config.embd_pdrop)
        if config.variant == "perceiver":
            self.down_block = DownProjectBlock(config)
            self.blocks = nn.Sequential(*[Block(config, config.bottleneck_dim) for _ in range(config.n_layer - 2)])
            self.up_block = UpProjectBlock(config)
        else:
            self.blocks = nn.Sequential(*[Block(config, config.block_size) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            module.weight.data.normal_(mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.data.zero_()

    def get_block_size(self) -> int:
        """The longest sequence the model reads (the handout's accessor)."""
        return self.config.block_size

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, caches: list[KVCache] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        start = caches[0].length if caches is not None else 0
        end = start + idx.size(1)
        assert end <= self.config.block_size, "sequence longer than block_size"
        x = self.tok_emb(idx)  # (B, T, C)
        if self.config.variant != "rope":
            x = x + self.pos_emb[:, start:end]
        x = self.drop(x)
        perceiver = self.config.variant == "perceiver"
        if caches is None:
            caches = [None] * (len(self.blocks) + 2 * perceiver)
        if perceiver:
            down, *middle, up = caches
            y = self.down_block(x, start, down)  # (B, min(m, T), C)
            for block, cache in zip(self.blocks, middle, strict=True):
                y = block(y, cache)
            x = self.up_block(y, x, start, up)  # (B, T, C)
        else:
            for block, cache in zip(self.blocks, caches, strict=True):
                x = block(x, cache)
        logits = self.head(self.ln_f(x))  # (B, T, V)
        loss = None
        if targets is not None:
            wide = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 logits: the loss in fp32
            loss = F.cross_entropy(wide.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=0)
        return logits, loss

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        do_sample: bool = False,
        top_k: int | None = None,
        constrain: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        stop_id: int | None = None,
    ) -> torch.Tensor:
        """idx (B, T) continued by max_new_tokens tokens, greedily unless do_sample, as minGPT does (in eval mode).
        constrain(logits (B, V), idx so far) may set logits to -inf; it stops once every row has produced `stop_id`.
        Past the block, each token recomputes the last block_size positions, as the handout does."""
        training = self.training
        self.eval()
        block = self.config.block_size
        caches = self.new_caches()
        stopped = torch.zeros(idx.size(0), dtype=torch.bool, device=idx.device)
        for i in range(max_new_tokens):
            if idx.size(1) > block:  # the rows only grow: the caches are not used again
                logits = self(idx[:, -block:])[0]
            else:
                logits = self(idx if i == 0 else idx[:, -1:], caches=caches)[0]
            logits = logits[:, -1].float() / temperature  # (B, V)
            if constrain is not None:
                logits = constrain(logits, idx)
            if top_k is not None:
                logits[logits < torch.topk(logits, min(top_k, logits.size(-1)))[0][:, [-1]]] = -math.inf
            if do_sample:
                next_ids = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            else:
                next_ids = logits.argmax(dim=-1, keepdim=True)
            idx = torch.cat((idx, next_ids), dim=1)
            if stop_id is not None:
                stopped |= next_ids[:, 0] == stop_id
                if stopped.all():
                    break
        self.train(training)
        return idx

    def new_caches(self) -> list[KVCache]:
        """Empty KV caches, one per block (perceiver: also the down- and up-projections)."""
        if self.config.variant == "perceiver":
            m = self.config.bottleneck_dim
            return [KVCache(self.config.block_size), *[KVCache(m) for _ in self.blocks], KVCache(m)]
        return [KVCache(self.config.block_size) for _ in self.blocks]
