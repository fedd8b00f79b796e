"""Decoding: `predict` gives greedy answers in batches of similar length, with key/value caches
(`next_logits_fn`, `attention.KVCache`): exactly the answers of the handout's loop, which decodes one
question at a time and recomputes the whole prefix for every character (bench/course.py; tested).
`continue_text` continues the recite protocol's recitations with GPT.generate."""

from __future__ import annotations

from collections.abc import Callable

import torch
from tqdm import tqdm

from dataset import MASK_CHAR, Vocabulary
from model import GPT
from utils import Progress

MAX_ANSWER_CHARS = 32  # greedy decoding stops after this many characters, as in the handout


@torch.no_grad()
def greedy_decode_batch(
    next_logits: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor],
    prompts: list[list[int]],
    max_new: int,
    stop_id: int,
    block_size: int,
    device: torch.device,
) -> list[list[int]]:
    """Greedy continuation of many prompts of different lengths at once.

    next_logits(tokens (b, W), lengths (b,), kept) -> logits (b, V): the prediction for position lengths[i] of each row,
    whose first lengths[i] tokens are tokens[i, :lengths[i]] (right-padded); `kept` is None on the first call,
    afterwards the indices of the previous call's rows that are still decoding (so a cache can drop the finished ones).
    Each row stops after `stop_id` is produced, after max_new tokens, or at block_size. Returns the generated ids of
    each row.
    """
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=device)
    limit = torch.clamp(lengths + max_new, max=block_size)
    tokens = torch.zeros(len(prompts), max(int(limit.max()), 1), dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = torch.tensor(p, dtype=torch.long)
    rows = torch.nonzero(lengths < limit).squeeze(1)  # the rows still decoding
    kept = None
    while rows.numel() > 0:
        row_lengths = lengths[rows]
        width = int(row_lengths.max())
        pred = next_logits(tokens[rows, :width], row_lengths, kept).argmax(dim=-1)  # (b,)
        tokens[rows, row_lengths] = pred
        lengths[rows] += 1
        going = (pred != stop_id) & (lengths[rows] < limit[rows])
        kept = torch.nonzero(going).squeeze(1)
        rows = rows[kept]
    return [tokens[i, len(p) : int(lengths[i])].tolist() for i, p in enumerate(prompts)]


DECODE_BATCH = 128  # questions decoded together (see README, "Speed")
DECODE_TOKENS = 4096  # and at most this many prompt positions (rows x longest prompt) in one batch


def decode_batches(lengths: list[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    """Split prompts of these lengths into batches of similar length, shortest first.

    Returns lists of indices into `lengths`: each batch holds at most max_rows prompts and, unless it is a single
    prompt, at most max_tokens positions counted as rows x its longest prompt, so a few long questions do not pad a
    whole batch to their length.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches = []
    while order:
        n = min(max_rows, len(order))
        while n > 1 and n * lengths[order[n - 1]] > max_tokens:
            n -= 1
        batches.append(order[:n])
        order = order[n:]
    return batches


def predict(model: GPT, vocab: Vocabulary, questions: list[str], device: torch.device, copy: bool = False) -> list[str]:
    """Greedy answers, one per question: each question + MASK is continued until the next MASK (or
    32 characters, or the block's end), decoded in batches of questions of similar length, so that
    little of each batch is padding. With `copy`, every answer is a span of its own question text."""
    model.eval()
    block, mask_id = model.get_block_size(), vocab.stoi[MASK_CHAR]
    encoded = [vocab.encode(q + MASK_CHAR) for q in questions]
    answers: dict[int, list[int]] = {}  # by question
    batches = decode_batches([len(e) for e in encoded], DECODE_BATCH, DECODE_TOKENS)
    for rows in tqdm(batches, desc="decoding", leave=False):
        batch = [encoded[i] for i in rows]
        next_logits = copying(next_logits_fn(model), batch, mask_id) if copy else next_logits_fn(model)
        decoded = greedy_decode_batch(next_logits, batch, MAX_ANSWER_CHARS, mask_id, block, device)
        answers.update(zip(rows, decoded, strict=True))
    # A newline inside an answer would break the one-line-per-input predictions file.
    return [vocab.decode(answers[i]).split(MASK_CHAR)[0].replace("\n", " ") for i in range(len(encoded))]


def shared_prefix_length(tokens: torch.Tensor, lengths: torch.Tensor) -> int:
    """How many leading tokens every row of tokens (B, W) has in common, leaving each row one of its own."""
    limit = int(lengths.min()) - 1
    if limit <= 0:
        return 0
    same = (tokens[:, :limit] == tokens[:1, :limit]).all(dim=0)  # (limit,)
    return int(same.long().cumprod(dim=0).sum())


def next_logits_fn(model: GPT):
    """next_logits for greedy_decode_batch, with KV caches (every variant: see GPT.new_caches).

    Dropping a finished row from the caches copies every other row's keys and values, so rows stay in the caches after
    they finish, decoding a PAD at position 0 (one cheap position, never read), until half the cached rows have
    finished: the caches are then copied once, keeping the rows still going.
    """
    caches = model.new_caches()
    slots = torch.empty(0, dtype=torch.long)  # the cache row of each row still decoding

    def cached(tokens: torch.Tensor, lengths: torch.Tensor, kept: torch.Tensor | None) -> torch.Tensor:
        nonlocal slots
        if kept is None:  # first call: one pass over every prompt, then forget the padding
            shared = shared_prefix_length(tokens, lengths)
            if shared:  # "Where was " once, not once per row
                model(tokens[:1, :shared], caches=caches)
                for cache in caches:
                    cache.keep_rows(torch.zeros(tokens.size(0), dtype=torch.long, device=tokens.device))
            logits = model(tokens[:, shared:], caches=caches)[0]
            for cache in caches:
                cache.truncate(lengths)
            slots = torch.arange(tokens.size(0), device=tokens.device)
            return logits[torch.arange(tokens.size(0)), lengths - 1 - shared]
        slots = slots[kept]
        cached_rows = caches[0].lengths.numel()
        if 2 * slots.numel() <= cached_rows:
            for cache in caches:
                cache.keep_rows(slots)
            slots = torch.arange(slots.numel(), device=tokens.device)
            cached_rows = slots.numel()
        inputs = torch.zeros(cached_rows, dtype=torch.long, device=tokens.device)  # finished rows: PAD
        inputs[slots] = tokens[torch.arange(tokens.size(0)), lengths - 1]  # the tokens produced last call
        if slots.numel() < cached_rows:  # finished rows restart at position 0, so they never outgrow the block
            finished = torch.ones(cached_rows, dtype=torch.bool, device=tokens.device)
            finished[slots] = False
            for cache in caches:
                cache.truncate(cache.lengths.masked_fill(finished, 0))
        return model(inputs[:, None], caches=caches)[0][slots, -1]

    return cached


RECITE_BATCH = 256  # prompts continued together by `continue_text`


def keep_spans(logits: torch.Tensor, texts: list[list[int]], answers: list[list[int]], stop_id: int) -> torch.Tensor:
    """logits (b, V) with -inf for every token that would not keep answers[i] a span of texts[i]: allowed are
    the tokens that follow an occurrence of answers[i] in texts[i], and stop_id once answers[i] holds a token."""
    allowed = torch.zeros_like(logits, dtype=torch.bool)
    for row, (text, so_far) in enumerate(zip(texts, answers, strict=True)):
        n = len(so_far)
        nexts = {text[j + n] for j in range(len(text) - n) if text[j : j + n] == so_far}
        allowed[row, sorted(nexts | ({stop_id} if n else set()))] = True
    return logits.masked_fill(~allowed, float("-inf"))


def copying(next_logits: Callable, prompts: list[list[int]], stop_id: int) -> Callable:
    """next_logits (see greedy_decode_batch) that continues each of `prompts` (text + stop_id) only with
    a span of its own text (keep_spans)."""
    rows = list(range(len(prompts)))  # the prompt of each row still decoding

    def copied(tokens: torch.Tensor, lengths: torch.Tensor, kept: torch.Tensor | None) -> torch.Tensor:
        nonlocal rows
        if kept is not None:
            rows = [rows[k] for k in kept.tolist()]
        answers = [tokens[b, len(prompts[r]) : int(lengths[b])].tolist() for b, r in enumerate(rows)]
        return keep_spans(next_logits(tokens, lengths, kept), [prompts[r][:-1] for r in rows], answers, stop_id)

    return copied


def continue_text(
    model: GPT, vocab: Vocabulary, prompts: list[str], length: int, banned: list[str], device: torch.device,
    what: str = "continuing",
) -> list[str]:  # fmt: skip
    """Greedy continuation of each prompt to `length` characters in all (the prompt included, cut there
    if longer), never choosing a character of `banned`: (N prompts) -> N strings of `length` characters.
    Prompts of one length continue together (GPT.generate, with key/value caches), RECITE_BATCH at a time;
    progress lines start with `what`."""
    banned_ids = [vocab.stoi[c] for c in banned]
    encoded = [vocab.encode(p, where=f"prompt {p!r}") for p in prompts]
    out, progress, done = [p[:length] for p in prompts], Progress(what, len(prompts)), 0
    for n in sorted({len(e) for e in encoded if len(e) < length}):
        rows = [i for i, e in enumerate(encoded) if len(e) == n]
        for batch in (rows[k : k + RECITE_BATCH] for k in range(0, len(rows), RECITE_BATCH)):
            idx = torch.tensor([encoded[i] for i in batch], dtype=torch.long, device=device)  # (b, n)
            new = min(length, model.get_block_size()) - n
            continued = model.generate(idx, new, banned=banned_ids)[:, n:].tolist()  # (b, new)
            for i, ids in zip(batch, continued, strict=True):
                out[i] = prompts[i] + vocab.decode(ids)
            done += len(batch)
            progress.update(done)
    return out
