"""Decoding: `predict` gives greedy answers to questions, `continue_text` the recite protocol's recollections. Both
continue prompts of one length together with GPT.generate and its key/value caches (`continue_prompts`): exactly the
answers of the handout's loop, which decodes one question at a time and recomputes the whole prefix for every
character (bench/course.py; tested)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from dataset import MASK_CHAR, Vocabulary
from model import GPT
from utils import Progress

MAX_ANSWER_CHARS = 32  # greedy decoding stops after this many characters, as in the handout
BATCH = 256  # prompts continued together


def answer_limit(prompt_len: int, block_size: int, max_answer_chars: int = MAX_ANSWER_CHARS) -> int:
    """How many tokens (closing MASK included) decoding may generate after a prompt of prompt_len tokens."""
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
    """Greedy continuations of `prompts` (lists of ids) by new_tokens(prompt length) tokens each (none if that is not
    positive): prompts of one length continue together, BATCH at a time (GPT.generate, with `constrain`; with
    `stop_id` a batch ends once each of its rows has produced it, so a row may run on past its own). Progress lines
    start with `what`. Returns the new ids of each prompt."""
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
    """logits (b, V) with -inf for every token that would not keep each row's answer a span of its text, a row being
    `text stop_id answer-so-far`: allowed are the tokens that follow an occurrence of the answer in the text, and
    stop_id once the answer holds a token (an answer already closed by stop_id is left only stop_id)."""
    allowed = torch.zeros_like(logits, dtype=torch.bool)
    for b, row in enumerate(rows):
        text, so_far = row[: row.index(stop_id)], row[row.index(stop_id) + 1 :]
        n = len(so_far)
        nexts = {text[j + n] for j in range(len(text) - n) if text[j : j + n] == so_far}
        allowed[b, sorted(nexts | ({stop_id} if n else set()))] = True
    return logits.masked_fill(~allowed, -math.inf)


def predict(model: GPT, vocab: Vocabulary, questions: list[str], device: torch.device, copy: bool = False) -> list[str]:
    """Greedy answers, one per question: each question + MASK is continued until the next MASK (or 32 characters, or
    the block's end). With `copy`, every answer is a span of its own question text (keep_spans)."""
    mask_id, block = vocab.stoi[MASK_CHAR], model.get_block_size()
    prompts = [vocab.encode(q + MASK_CHAR) for q in questions]
    copying = (lambda logits, idx: keep_spans(logits, idx.tolist(), mask_id)) if copy else None
    answers = continue_prompts(model, prompts, lambda n: answer_limit(n, block), device, copying, mask_id, "answering")
    # A newline inside an answer would break the one-line-per-input predictions file.
    return [vocab.decode(ids).split(MASK_CHAR)[0].replace("\n", " ") for ids in answers]


def continue_text(
    model: GPT, vocab: Vocabulary, prompts: list[str], length: int, banned: list[str], device: torch.device,
    what: str = "continuing",
) -> list[str]:  # fmt: skip
    """Greedy continuation of each prompt to `length` characters in all (the prompt included, cut there if longer),
    never choosing a character of `banned`: (N prompts) -> N strings of `length` characters. Progress lines start
    with `what`."""
    banned_ids = torch.tensor([vocab.stoi[c] for c in banned], dtype=torch.long, device=device)
    encoded = [vocab.encode(p, where=f"prompt {p!r}") for p in prompts]
    end, ban = min(length, model.get_block_size()), lambda logits, _: logits.index_fill(1, banned_ids, -math.inf)
    new = continue_prompts(model, encoded, lambda n: end - n, device, ban, what=what)
    return [p[:length] + vocab.decode(ids) for p, ids in zip(prompts, new, strict=True)]
