"""evaluate and ask: greedy answers to questions, scored by the model's confidence."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import time

import torch
from torch.utils.tensorboard import SummaryWriter

import recite
from confidence import beam_search, evaluation_summary, format_ask, format_summary, score_answers, scores_tsv
from config import BLOCK_SIZE, RunConfig, build_model
from dataset import CharCorruptionDataset, Question, Vocabulary, question_problem, read_questions, score_places
from decode import predict
from model import GPT
from params import load_params, read_sidecar, sidecar_path
from utils import UserError, locate_data, write_json_atomic, write_text_atomic


def evaluate(
    args: RunConfig, corpus: CharCorruptionDataset, model: GPT, device: torch.device, writer: SummaryWriter
) -> dict:
    """Greedy answers to --eval_corpus_path into --outputs_path (a line per input line) and --scores_path, scored
    where places are given; returns what it found, also written to <outputs_path>.json."""
    vocab, path = corpus.vocab, locate_data(args.eval_corpus_path)
    entries = read_questions(path, require_place=False)
    questions = [q for q in entries if q is not None]
    for q in questions:  # check them all before any work
        if problem := question_problem(q.text, BLOCK_SIZE):
            raise UserError(f"{path}:{q.line}: the question {problem}")
        vocab.encode(q.text + (q.place or ""), where=f"{path}:{q.line}")  # a place is read in the same characters
    load_params(model, vocab, args.reading_params_path)
    t0, found = time.time(), {}
    recited = recitations(args, vocab, questions, device, str(path))
    if recited is not None:
        share = recite.place_in_recitation(questions, recited)
        if not math.isnan(share):
            print(f"the gold place is in {share:.1%} of the recitations (the reader's ceiling); its answers are spans")
            found["place_in_recitation"] = share
    texts = [q.text for q in questions] if recited is None else recited
    model.to(device)
    predictions = predict(model, vocab, texts, device, copy=recited is not None)
    scores = score_answers(model, vocab, texts, predictions, device)
    found["seconds"] = time.time() - t0
    total, correct = score_places(questions, predictions)
    if total:  # the handout's line first
        print(f"Correct: {float(correct)} out of {float(total)}: {correct / total * 100}%")
        found |= evaluation_summary(questions, predictions, scores)
        print(format_summary(found))
    for key, value in found.items():
        writer.add_scalar(f"eval/{key}", value, 0)
    counts = {"questions": len(questions), "with_places": total, "correct": correct}
    if args.scores_path is not None:  # first: a failed write leaves no predictions
        write_text_atomic(args.scores_path, scores_tsv(entries, scores))
    answers = iter(s.answer for s in scores)
    write_text_atomic(args.outputs_path, "".join((next(answers) if q is not None else "") + "\n" for q in entries))
    write_json_atomic(sidecar_path(args.outputs_path), {**counts, **found, "config": dataclasses.asdict(args)})
    targets = "" if "accuracy" in found else "; no targets provided"
    print(
        f"Predictions written to {args.outputs_path}, what evaluate found to {sidecar_path(args.outputs_path)}{targets}"
    )
    return found


def recitations(
    args: RunConfig, vocab: Vocabulary, questions: list[Question], device: torch.device, source: str
) -> list[str] | None:
    """For a recite reader, the questions' people recited by the params its sidecar links; else None."""
    path = args.reading_params_path
    side = read_sidecar(path) or {}
    if side.get("protocol") != "recite":
        return None
    chars = side.get("recite_chars")
    if problem := recite.recite_chars_problem(chars, args.variant, args.bottleneck_dim, BLOCK_SIZE, 1):
        raise UserError(f"{path}: its sidecar gives recite_chars {chars!r}, which {problem}")
    pretrained = recite.linked_pretrained(path, side)
    reciter = build_model(args, len(vocab))
    load_params(reciter, vocab, str(pretrained))
    t0 = time.time()
    texts = recite.recite(reciter, vocab, questions, chars, device, source)
    print(f"recited {len(questions)} people with {pretrained} in {time.time() - t0:.1f} s ({chars} characters each)")
    return texts


def ask(args: RunConfig, corpus: CharCorruptionDataset, model: GPT, device: torch.device) -> None:
    """Answer one question (checked by config.check_args): the greedy answer, its confidence, a beam's top 3."""
    question, vocab = args.question, corpus.vocab
    vocab.encode(question, where=f"question {question!r}")
    load_params(model, vocab, args.reading_params_path)
    model.to(device)
    with contextlib.redirect_stdout(io.StringIO()):  # ask prints only its answer
        recited = recitations(args, vocab, [Question(question, None, 1)], device, "question")
    reader = recited is not None
    prompt = recited[0] if reader else question
    answer = predict(model, vocab, [prompt], device, copy=reader)[0]
    (score,) = score_answers(model, vocab, [prompt], [answer], device)
    if reader:
        p = math.exp(score.mean_logprob)
        print(f"I recall: {prompt!r} -> {answer!r} (confidence: probability {p:.3g} per character)")
    alternatives = beam_search(model, vocab, prompt, device, copy=reader)
    print(format_ask(question, score, alternatives))
