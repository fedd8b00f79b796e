"""Decoding: `predict` gives greedy answers, `continue_text` the recite protocol's recollections. Prompts of one length
decode together through GPT.generate's KV caches, to exactly the answers of the handout's one-at-a-time loop
(bench/course.py; tested)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from dataset import MASK_CHAR, Vocabulary
from model import GPT
from utils import Progress

MAX_ANSWER_CHARS = 32  # the handout's limit on an answer's length
BATCH = 256  # prompts continued together


def answer_limit(prompt_len: int, block_size: int, max_answer_chars: int = MAX_ANSWER_CHARS) -> int:
    """How many tokens, the closing MASK included, may follow a prompt of prompt_len tokens."""
    return max(0, min(max_answer_chars, block_size - prompt_len))


def continue_prompts(
    model: GPT,
    prompts: list[list[int]],
    new_tokens: Callable[[int], int],
    device: torch.device,
    constrain: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    stop_id: int | None = None,
    what: str = "continuing",
) -> list[list[int]]:
    """The new ids of greedy continuations of `prompts`, new_tokens(prompt length) tokens each, BATCH prompts of one
    length at a time. A batch ends once each row has produced `stop_id`; a row may run past its own."""
    out: dict[int, list[int]] = {}  # by prompt
    progress = Progress(what, len(prompts))
    for n in sorted({len(p) for p in prompts if new_tokens(len(p)) > 0}):
        rows = [i for i, p in enumerate(prompts) if len(p) == n]
        for batch in (rows[k : k + BATCH] for k in range(0, len(rows), BATCH)):
            idx = torch.tensor([prompts[i] for i in batch], dtype=torch.long, device=device)  # (b, n)
            new = model.generate(idx, new_tokens(n), constrain=constrain, stop_id=stop_id)[:, n:]
            out.update(zip(batch, new.tolist(), strict=True))
            progress.update(len(out))
    return [out.get(i, []) for i in range(len(prompts))]


def keep_spans(logits: torch.Tensor, rows: list[list[int]], stop_id: int) -> torch.Tensor:
    """logits (b, V), -inf for the tokens that would make a row's answer no span of its text; a row is
    `text stop_id answer`, stop_id allowed once the answer is not empty."""
    allowed = torch.zeros_like(logits, dtype=torch.bool)
    for b, row in enumerate(rows):
        text, so_far = row[: row.index(stop_id)], row[row.index(stop_id) + 1 :]
        n = len(so_far)
        nexts = {text[j + n] for j in range(len(text) - n) if text[j : j + n] == so_far}
        allowed[b, sorted(nexts | ({stop_id} if n else set()))] = True
    return logits.masked_fill(~allowed, -math.inf)


def predict(model: GPT, vocab: Vocabulary, questions: list[str], device: torch.device, copy: bool = False) -> list[str]:
    """Greedy answers: each question + MASK continued to the next MASK or answer_limit; with `copy`, a span of it."""
    mask_id, block = vocab.stoi[MASK_CHAR], model.get_block_size()
    prompts = [vocab.encode(q + MASK_CHAR) for q in questions]
    copying = (lambda logits, idx: keep_spans(logits, idx.tolist(), mask_id)) if copy else None
    answers = continue_prompts(model, prompts, lambda n: answer_limit(n, block), device, copying, mask_id, "answering")
    # A newline inside an answer would break the one-line-per-input predictions file.
    return [vocab.decode(ids).split(MASK_CHAR)[0].replace("\n", " ") for ids in answers]


def continue_text(
    model: GPT,
    vocab: Vocabulary,
    prompts: list[str],
    length: int,
    banned: list[str],
    device: torch.device,
    what: str = "continuing",
) -> list[str]:
    """Each prompt continued greedily to `length` characters (a longer one cut), never to one of `banned`."""
    banned_ids = torch.tensor([vocab.stoi[c] for c in banned], dtype=torch.long, device=device)
    encoded = [vocab.encode(p, where=f"prompt {p!r}") for p in prompts]
    end, ban = min(length, model.get_block_size()), lambda logits, _: logits.index_fill(1, banned_ids, -math.inf)
    new = continue_prompts(model, encoded, lambda n: end - n, device, ban, what=what)
    return [p[:length] + vocab.decode(ids) for p, ids in zip(prompts, new, strict=True)]
