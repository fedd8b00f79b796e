"""Know when the model is guessing: answer confidence, a small beam search, and selective-accuracy metrics.

An answer's confidence is its teacher-forced log-probability over its characters and closing MASK (none if it was
cut off) per token. Ranking and calibration use this mean because the sum falls with every character, ranking
"Rome" above "Rio de Janeiro"; exp(mean) is a probability in (0, 1].
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from dataset import MASK_CHAR, Question, Vocabulary
from decode import MAX_ANSWER_CHARS, answer_limit, keep_spans

COVERAGES = (1.0, 0.75, 0.5, 0.25, 0.1)
ECE_BINS = 10
SCORE_ROWS = 512  # rows score_answers scores in one forward pass


@dataclass
class AnswerScore:
    """An answer's log-probability summed over `tokens` tokens, and per token."""

    answer: str
    logprob: float
    mean_logprob: float
    tokens: int


# Scoring and beam search


@torch.no_grad()
def score_answers(
    model: torch.nn.Module, vocab: Vocabulary, questions: Sequence[str], answers: Sequence[str], device: torch.device
) -> list[AnswerScore]:
    """Teacher-forced log-probability of each answer to its question, SCORE_ROWS right-padded rows (a causal model:
    padding changes nothing) per forward pass."""
    model.eval()
    mask_id = vocab.stoi[MASK_CHAR]
    block = model.get_block_size()
    rows: list[torch.Tensor] = []  # question MASK answer [MASK]: inputs [:-1], next tokens [1:]
    masks: list[torch.Tensor] = []  # which next tokens are scored: position p predicts token p + 1
    for q, a in zip(questions, answers, strict=True):
        prompt, answer = vocab.encode(q + MASK_CHAR), vocab.encode(a)
        closed = len(answer) < answer_limit(len(prompt), block)
        rows.append(torch.tensor(prompt + answer + ([mask_id] if closed else [])))
        masks.append(torch.arange(len(rows[-1]) - 1) >= len(prompt) - 1)
    scores: list[AnswerScore] = []
    for i in range(0, len(rows), SCORE_ROWS):
        seqs = pad_sequence(rows[i : i + SCORE_ROWS], batch_first=True).to(device)  # PAD-padded (B, T + 1)
        scored = pad_sequence(masks[i : i + SCORE_ROWS], batch_first=True).to(device)  # (B, T)
        logits, _ = model(seqs[:, :-1])  # (B, T, V)
        logp = F.log_softmax(logits.float(), dim=-1).gather(-1, seqs[:, 1:, None]).squeeze(-1)  # (B, T)
        total = torch.where(scored, logp, 0.0).sum(dim=1).tolist()
        count = scored.sum(dim=1).tolist()
        for k, (lp, n) in enumerate(zip(total, count, strict=True)):
            scores.append(AnswerScore(answers[i + k], lp, lp / max(n, 1), n))
    return scores


@torch.no_grad()
def beam_search(
    model: torch.nn.Module,
    vocab: Vocabulary,
    question: str,
    device: torch.device,
    beam: int = 3,
    max_answer_chars: int = MAX_ANSWER_CHARS,
    copy: bool = False,
) -> list[AnswerScore]:
    """The `beam` most probable answers by beam search over characters, best first (with `copy`, only spans of
    `question`), stopping when no live beam can beat the `beam`-th finished answer."""
    model.eval()
    mask_id = vocab.stoi[MASK_CHAR]
    prompt = vocab.encode(question + MASK_CHAR)
    limit = answer_limit(len(prompt), model.get_block_size(), max_answer_chars)
    live: list[tuple[list[int], float]] = [([], 0.0)]  # (answer ids, logprob)
    done: list[AnswerScore] = []
    for step in range(limit):
        rows = [prompt + ids for ids, _ in live]
        logits, _ = model(torch.tensor(rows, dtype=torch.long, device=device))  # (b, T, V)
        logp = F.log_softmax(logits[:, -1, :].float(), dim=-1)  # (b, V)
        if copy:
            logp = keep_spans(logp, rows, mask_id)
        top_lp, top_id = logp.topk(min(beam, logp.size(-1)), dim=-1)  # (b, beam)
        candidates: list[tuple[list[int], float]] = []
        for (ids, lp), row_lp, row_id in zip(live, top_lp.tolist(), top_id.tolist(), strict=True):
            for tok_lp, tok in zip(row_lp, row_id, strict=True):
                if tok_lp == float("-inf"):  # fewer allowed tokens than the beam is wide
                    continue
                if tok == mask_id or step + 1 == limit:  # closed, or cut off: no room left for the closing MASK
                    answer = vocab.decode(ids if tok == mask_id else ids + [tok])
                    done.append(AnswerScore(answer, lp + tok_lp, (lp + tok_lp) / (step + 1), step + 1))
                else:
                    candidates.append((ids + [tok], lp + tok_lp))
        live = sorted(candidates, key=lambda c: -c[1])[:beam]
        done.sort(key=lambda s: -s.logprob)
        if not live or (len(done) >= beam and live[0][1] <= done[beam - 1].logprob):
            break
    return done[:beam]


# Selective accuracy and calibration


def accuracy_coverage_curve(confidence: Sequence[float], correct: Sequence[bool]) -> np.ndarray:
    """Accuracy among the k most confident answers, k = 1..N -> (N,), ties in their input order."""
    conf, ok = np.asarray(confidence, dtype=np.float64), np.asarray(correct, dtype=bool)
    if len(conf) != len(ok) or len(ok) == 0:
        raise ValueError(f"need as many confidences as answers, at least one: got {len(conf)} and {len(ok)}")
    order = np.argsort(-conf, kind="stable")
    return np.cumsum(ok[order]) / np.arange(1, len(ok) + 1)


def accuracy_at_coverage(confidence: Sequence[float], correct: Sequence[bool], coverage: float) -> float:
    """Accuracy among the ceil(coverage·N) most confident answers (at least one)."""
    curve = accuracy_coverage_curve(confidence, correct)
    k = max(1, math.ceil(coverage * len(curve) - 1e-9))  # the epsilon keeps 0.1·50 at 5, not 6
    return float(curve[min(k, len(curve)) - 1])


def coverage_auc(confidence: Sequence[float], correct: Sequence[bool]) -> float:
    """Area under the accuracy-coverage curve: the mean accuracy at coverage k/N, k = 1..N."""
    return float(accuracy_coverage_curve(confidence, correct).mean())


def expected_calibration_error(probability: Sequence[float], correct: Sequence[bool], bins: int = ECE_BINS) -> float:
    """Sum over `bins` equal-width bins of [0, 1] of (share of answers) · |accuracy - mean probability|."""
    p, ok = np.clip(np.asarray(probability, dtype=np.float64), 0.0, 1.0), np.asarray(correct, dtype=np.float64)
    if len(p) != len(ok) or len(ok) == 0:
        raise ValueError(f"need as many probabilities as answers, at least one: got {len(p)} and {len(ok)}")
    which = np.minimum((p * bins).astype(np.int64), bins - 1)  # probability 1.0 goes in the last bin
    # a bin's term is |its correct answers - its summed probability| / N
    return float(np.abs(np.bincount(which, ok, bins) - np.bincount(which, p, bins)).sum() / len(p))


# Summaries for `evaluate`, `ask` and the report


def evaluation_summary(
    questions: Sequence[Question], predictions: Sequence[str], scores: Sequence[AnswerScore]
) -> dict[str, float]:
    """Accuracy, and for answers ranked by mean logprob, the accuracy at COVERAGES, the coverage AUC and the ECE."""
    correct = [p == q.place for p, q in zip(predictions, questions, strict=True)]
    ranked_by = [s.mean_logprob for s in scores]
    metrics = {"accuracy": sum(correct) / len(correct)}
    for c in COVERAGES:
        metrics[f"accuracy_at_coverage_{round(c * 100)}"] = accuracy_at_coverage(ranked_by, correct, c)
    metrics["coverage_auc"] = coverage_auc(ranked_by, correct)
    metrics["ece"] = expected_calibration_error(np.exp(np.asarray(ranked_by, dtype=np.float64)), correct)
    return metrics


def format_summary(m: dict[str, float]) -> str:
    """The lines `evaluate` prints after its `Correct: ...` line."""
    lines = ["Accuracy of the most confident answers (ranked by mean log-probability per character):"]
    lines += [f"  coverage {round(c * 100):3d}%: {m[f'accuracy_at_coverage_{round(c * 100)}']:.1%}" for c in COVERAGES]
    lines.append(f"  area under the accuracy-coverage curve: {m['coverage_auc']:.3f}")
    lines.append(f"  expected calibration error ({ECE_BINS} bins of exp(mean logprob)): {m['ece']:.3f}")
    return "\n".join(lines)


def scores_tsv(entries: Sequence[Question | None], scores: Sequence[AnswerScore]) -> str:
    """`prediction<TAB>logprob<TAB>mean_logprob` per input line (blank for a blank one; tabs and line breaks in an
    answer made spaces)."""
    rows = (re.sub(r"[\t\n\r]", " ", s.answer) + f"\t{s.logprob:.4f}\t{s.mean_logprob:.4f}" for s in scores)
    return "".join((next(rows) if q is not None else "") + "\n" for q in entries)


def format_ask(question: str, answer: AnswerScore, alternatives: Sequence[AnswerScore]) -> str:
    """What `ask` prints: the greedy answer, its confidence and the beam's, in repr to show empty ones."""
    lines = [
        question,
        f"answer: {answer.answer!r}",
        f"confidence: logprob {answer.logprob:.3f}, mean per character {answer.mean_logprob:.3f}, "
        f"probability {math.exp(answer.logprob):.3g}",
        f"top {len(alternatives)} answers by beam search:",
    ]
    width = max((len(repr(a.answer)) for a in alternatives), default=0)
    for i, a in enumerate(alternatives, start=1):
        lines.append(f"  {i}. {a.answer!r:<{width}}  logprob {a.logprob:8.3f}  probability {math.exp(a.logprob):.3g}")
    return "\n".join(lines)
