"""The course's plain code, which src/'s fast path is checked and timed against: the CS224N handouts' model,
decoding and training loop (2023 for vanilla and the perceiver, 2024 for rope), written from their instructions
independently of src/'s model, decoder and trainer. `CourseGPT` has the handouts' module and parameter names,
so src's params load into it strictly (`course_copy`); `sample` and `predict` decode greedily, one question
at a time, the whole prefix recomputed; `optimizer`, `batches` and `train_step` are the handout trainer's
loop in fp32. Tests compare src with these; bench/bench_speed.py times them as the "reference".
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from dataset import MASK_CHAR, Vocabulary  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from trainer import TrainerConfig  # noqa: E402

MAX_ANSWER_CHARS = 32  # the handout's evaluation decodes 32 characters


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask=None, dropout_p: float = 0.0) -> torch.Tensor:
    """The handout's masked softmax attention, with torch's dropout on the weights. q: (B, nh, Tq, hs); k, v:
    (B, nh, Tk, hs); mask broadcastable to (B, nh, Tq, Tk), 0 where a query may not see a key, or None.
    Returns (B, nh, Tq, hs)."""
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    if mask is not None:
        att = att.masked_fill(mask == 0, -1e10)
    return F.dropout(F.softmax(att, dim=-1), dropout_p) @ v


def rope_cache(block_size: int, head_dim: int) -> torch.Tensor:
    """The 2024 handout's rope_cache (block_size, head_dim/2, 2): (cos tθ_i, sin tθ_i), θ_i = 10000^(-2i/head_dim)."""
    theta = 1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim)
    freqs = torch.outer(torch.arange(block_size).float(), theta)
    return torch.stack([torch.cos(freqs), torch.sin(freqs)], dim=-1)


def apply_rope(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """Consecutive pairs of x (B, nh, T, hs) as complex numbers, multiplied by the cache's -> (B, nh, T, hs)."""
    as_complex = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    turn = torch.view_as_complex(cache[: x.size(-2)].contiguous())
    return torch.view_as_real(as_complex * turn).flatten(-2)


class CourseAttention(nn.Module):
    """Causal self-attention (x_q is x_kv) or the perceiver's cross-attention, with the handout's names:
    forward(x_kv (B, Tk, C), x_q (B, Tq, C)) -> (B, Tq, C), query i seeing keys j <= i."""

    def __init__(self, c: GPTConfig, size: int, rope: bool = False):
        super().__init__()
        self.key, self.query, self.value, self.proj = (nn.Linear(c.n_embd, c.n_embd) for _ in range(4))
        self.attn_pdrop, self.resid_drop = c.attn_pdrop, nn.Dropout(c.resid_pdrop)
        self.n_head, self.rope = c.n_head, rope
        if rope:
            self.register_buffer("rope_cache", rope_cache(size, c.n_embd // c.n_head))
        self.register_buffer("mask", torch.tril(torch.ones(size, size)).view(1, 1, size, size))

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, C) -> (B, nh, T, hs)"""
        B, T, C = x.size()
        return x.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)

    def forward(self, x_kv: torch.Tensor, x_q: torch.Tensor) -> torch.Tensor:
        k, q, v = self.heads(self.key(x_kv)), self.heads(self.query(x_q)), self.heads(self.value(x_kv))
        if self.rope:
            q, k = apply_rope(q, self.rope_cache), apply_rope(k, self.rope_cache)
        mask = self.mask[:, :, : q.size(2), : k.size(2)]
        y = attention(q, k, v, mask, self.attn_pdrop if self.training else 0.0)
        B, _, Tq, _ = y.size()
        return self.resid_drop(self.proj(y.transpose(1, 2).contiguous().view(B, Tq, -1)))


def course_mlp(c: GPTConfig) -> nn.Sequential:
    """The blocks' GELU MLP of width 4 * n_embd, with dropout: (B, T, C) -> (B, T, C)."""
    return nn.Sequential(
        nn.Linear(c.n_embd, 4 * c.n_embd), nn.GELU(), nn.Linear(4 * c.n_embd, c.n_embd), nn.Dropout(c.resid_pdrop)
    )


class CourseBlock(nn.Module):
    """x + attn(ln1(x)), then + mlp(ln2(x)): (B, T, C) -> (B, T, C)."""

    def __init__(self, c: GPTConfig, size: int, rope: bool = False):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(c.n_embd), nn.LayerNorm(c.n_embd)
        self.attn, self.mlp = CourseAttention(c, size, rope), course_mlp(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h)
        return x + self.mlp(self.ln2(x))


class CourseDownProjectBlock(nn.Module):
    """2023 handout: the basis C (1, m, C) attends to x_input (B, T, C) -> (B, m, C); layernorms on C, MLP input."""

    def __init__(self, c: GPTConfig):
        super().__init__()
        self.C = nn.Parameter(torch.zeros(1, c.bottleneck_dim, c.n_embd))
        self.ln1, self.ln2 = nn.LayerNorm(c.n_embd), nn.LayerNorm(c.n_embd)
        self.attn, self.mlp = CourseAttention(c, c.block_size), course_mlp(c)

    def forward(self, x_input: torch.Tensor) -> torch.Tensor:
        x = self.C + self.attn(x_input, self.ln1(self.C))
        return x + self.mlp(self.ln2(x))


class CourseUpProjectBlock(nn.Module):
    """2023 handout: x_input (B, T, C) attends to y (B, m, C) -> (B, T, C); layernorms on y, MLP input."""

    def __init__(self, c: GPTConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(c.n_embd), nn.LayerNorm(c.n_embd)
        self.attn, self.mlp = CourseAttention(c, c.block_size), course_mlp(c)

    def forward(self, y: torch.Tensor, x_input: torch.Tensor) -> torch.Tensor:
        x = x_input + self.attn(self.ln1(y), x_input)
        return x + self.mlp(self.ln2(x))


class CourseGPT(nn.Module):
    """The handouts' GPT (config.variant vanilla, perceiver or rope). forward(idx (B, T), targets (B, T) or
    None) -> (logits (B, T, V), cross-entropy loss with PAD (id 0) ignored, or None). Load its parameters
    from a trained model (`course_copy`)."""

    def __init__(self, c: GPTConfig):
        super().__init__()
        self.c = c
        self.tok_emb = nn.Embedding(c.vocab_size, c.n_embd)
        if c.variant != "rope":
            self.pos_emb = nn.Parameter(torch.zeros(1, c.block_size, c.n_embd))
        self.drop = nn.Dropout(c.embd_pdrop)
        if c.variant == "perceiver":
            self.down_block = CourseDownProjectBlock(c)
            self.blocks = nn.Sequential(*[CourseBlock(c, c.bottleneck_dim) for _ in range(c.n_layer - 2)])
            self.up_block = CourseUpProjectBlock(c)
        else:
            self.blocks = nn.Sequential(*[CourseBlock(c, c.block_size, c.variant == "rope") for _ in range(c.n_layer)])
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.head = nn.Linear(c.n_embd, c.vocab_size, bias=False)

    def get_block_size(self) -> int:
        """The longest sequence the model reads."""
        return self.c.block_size

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        x_input = self.tok_emb(idx)
        if self.c.variant != "rope":
            x_input = x_input + self.pos_emb[:, : idx.size(1)]
        x_input = self.drop(x_input)
        if self.c.variant == "perceiver":
            x = self.up_block(self.blocks(self.down_block(x_input)), x_input)
        else:
            x = self.blocks(x_input)
        logits = self.head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=0)
        return logits, loss


def course_copy(model: GPT) -> CourseGPT:
    """The course's model with `model`'s config and parameters (loaded strictly), device and train/eval mode."""
    course = CourseGPT(model.config).to(next(model.parameters()).device).train(model.training)
    course.load_state_dict(model.state_dict())
    return course


@torch.no_grad()
def sample(model: nn.Module, x: torch.Tensor, steps: int) -> torch.Tensor:
    """The handout's sampler, greedy: extend each row of x (B, T) by `steps` tokens -> (B, T + steps), the
    context cropped to the model's block_size and the whole prefix recomputed for every token."""
    block_size = model.get_block_size()
    model.eval()
    for _ in range(steps):
        logits, _ = model(x if x.size(1) <= block_size else x[:, -block_size:])
        _, ix = torch.topk(logits[:, -1, :], k=1, dim=-1)
        x = torch.cat((x, ix), dim=1)
    return x


def predict(model: nn.Module, vocab: Vocabulary, questions: list[str], device: torch.device) -> list[str]:
    """The handout's evaluation: each question + MASK continued greedily by `sample`, one at a time; the
    answer is what comes before the next MASK. Decoding stops at the block's end (the handout would crop and
    go on: with questions of at most block_size - 2 characters, as run.py allows, that changes nothing)."""
    answers = []
    for question in questions:
        ids = vocab.encode(question + MASK_CHAR)
        x = torch.tensor([ids], dtype=torch.long, device=device)
        out = sample(model, x, min(MAX_ANSWER_CHARS, model.get_block_size() - len(ids)))[0, len(ids) :]
        answers.append(vocab.decode(out.tolist()).split(MASK_CHAR)[0].replace("\n", " "))
    return answers


def optimizer(model: nn.Module, config: TrainerConfig) -> torch.optim.AdamW:
    """The handout's AdamW (PyTorch's default implementation, not fused): decay on every parameter but biases
    and names containing "LayerNorm.weight" (none here), at config's learning_rate, betas and weight_decay."""
    no_decay = ("bias", "LayerNorm.weight")
    named = list(model.named_parameters())
    groups = [
        {"params": [p for n, p in named if not any(nd in n for nd in no_decay)], "weight_decay": config.weight_decay},
        {"params": [p for n, p in named if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.learning_rate, betas=config.betas)


def batches(dataset: Dataset, batch_size: int) -> DataLoader:
    """The handout's batches: a DataLoader over dataset[i] -> (x, y) in the dataset's order, at full length."""
    return DataLoader(dataset, batch_size=batch_size)


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, grad_norm_clip: float
) -> torch.Tensor:
    """One fp32 step of the handout's loop on a batch x, y (B, T): forward, backward, clip, update. Returns the loss."""
    _, loss = model(x, y)
    model.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_norm_clip)
    optimizer.step()
    return loss
