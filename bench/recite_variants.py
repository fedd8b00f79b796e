"""Research (not kept, see bench/RESEARCH.md section 8): two ways to read more out of recitations.

    python bench/recite_variants.py bench/runs/NAME [reader_tag]

1. contexts: recite each dev person after the tails of 8 other documents as well as after nothing,
   read every recitation, keep the most confident answer; also count the plain recitation's
   misses by cause.
2. spans: the reader chooses among word spans of its recitation (1-3 words, capitalised or not) by
   teacher-forced score, instead of decoding freely.
"""

import json
import random
import re
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
import run  # noqa: E402
from confidence import most_confident, person_name, score_answers  # noqa: E402
from config import BLOCK_SIZE, build_model  # noqa: E402
from dataset import MASK_CHAR, PAD_CHAR, CharCorruptionDataset, read_questions, read_text  # noqa: E402
from decode import MAX_ANSWER_CHARS, continue_text, predict  # noqa: E402
from params import load_params  # noqa: E402

work = Path(sys.argv[1])
tag = sys.argv[2] if len(sys.argv) > 2 else "cpu"
torch.manual_seed(0)
text = read_text(ROOT / "data" / "wiki.txt")
vocab = CharCorruptionDataset(text, BLOCK_SIZE).vocab
docs = [line for line in text.split("\n") if line]
device = torch.device("cpu")


def model_of(path: Path):
    args = run.make_parser().parse_args(["evaluate", "vanilla", "wiki.txt", "--reading_params_path", str(path)])
    run.apply_preset(args)
    args.dropout = 0.0
    side = json.loads(Path(str(path) + ".json").read_text())
    m = build_model(args, len(vocab), side["variant"])
    load_params(m, vocab, str(path))
    return m.to(device)


reciter = model_of(work / "pretrain.params")
reader = model_of(work / f"reader_{tag}.params")
questions = [q for q in read_questions(ROOT / "data" / "birth_dev.tsv", require_place=True) if q is not None]
names = [person_name(q.text) for q in questions]
doc_of = {}
for d in docs:
    n = d.split(".")[0]
    doc_of.setdefault(n, d)
CHARS = 100
rng = random.Random(0)
tails = [d[-k:] for d, k in zip(rng.sample(docs, 8), [3, 6, 9, 12, 14, 5, 8, 11])]
contexts = ["", *tails]
all_scores = []
held_any = [False] * len(questions)
for c in contexts:
    prompts = [c + n + "." for n in names]
    out = continue_text(reciter, vocab, prompts, len(c) + CHARS, [MASK_CHAR, PAD_CHAR], device)
    recs = [o[len(c) :].replace("\t", " ").replace("\n", " ") for o in out]
    held = [q.place in r for q, r in zip(questions, recs)]
    held_any = [a or b for a, b in zip(held_any, held)]
    preds = predict(reader, vocab, recs, device)
    scores = score_answers(reader, vocab, recs, preds, device, MAX_ANSWER_CHARS)
    all_scores.append(scores)
    acc = sum(s.answer == q.place for s, q in zip(scores, questions)) / len(questions)
    comb = most_confident(all_scores)
    cacc = sum(s.answer == q.place for s, q in zip(comb, questions)) / len(questions)
    print(
        f"context {c!r:18} ceiling {sum(held) / len(held):.3f} acc {acc:.3f} | "
        f"union ceiling {sum(held_any) / len(held):.3f} combined acc {cacc:.3f}",
        flush=True,
    )
    if c == "":
        base_recs = recs
        base_scores = scores

# Misses of the plain recitation, by cause
cats = {}
for q, n, r, s in zip(questions, names, base_recs, base_scores):
    d = doc_of.get(n)
    if q.place in r:
        cat = (
            "held, read right"
            if s.answer == q.place
            else ("held, answered another place in it" if s.answer in r else "held, answered a place not in it")
        )
    elif d is None or q.place not in d:
        cat = "place not in the document"
    else:
        end = d.index(q.place) + len(q.place)
        lcp = 0
        while lcp < min(len(d), len(r)) and d[lcp] == r[lcp]:
            lcp += 1
        if end > CHARS:
            cat = "place beyond the recited window in the document"
        elif lcp >= d.index(q.place):
            cat = "recited up to the place, then another place"
        else:
            cat = "drifted from the document before the place"
    cats[cat] = cats.get(cat, 0) + 1
for k, v in sorted(cats.items(), key=lambda kv: -kv[1]):
    print(f"{v:4d}  {k}")


# 2. spans
recs = base_recs
preds = [s.answer for s in base_scores]
WORD = re.compile(r"[^\W\d_][\w'-]*")


def spans(text: str, capital: bool, longest: int = 3) -> list[str]:
    words = list(WORD.finditer(text))
    out = set()
    for i in range(len(words)):
        for j in range(i, min(i + longest, len(words))):
            if capital and not all(w.group()[0].isupper() for w in words[i : j + 1]):
                break
            s = text[words[i].start() : words[j].end()]
            if len(s) <= min(MAX_ANSWER_CHARS, 128 - len(text) - 3):
                out.add(s)
    return sorted(out)


for capital in (True, False):
    t0 = time.time()
    rows, owners = [], []
    for k, r in enumerate(recs):
        for s in spans(r, capital):
            rows.append(s)
            owners.append(k)
    scores = score_answers(reader, vocab, [recs[k] for k in owners], rows, torch.device("cpu"), MAX_ANSWER_CHARS)
    best_total, best_mean = {}, {}
    for k, s in zip(owners, scores):
        if k not in best_total or s.logprob > best_total[k].logprob:
            best_total[k] = s
        if k not in best_mean or s.mean_logprob > best_mean[k].mean_logprob:
            best_mean[k] = s
    n = len(questions)
    acc_t = sum(best_total.get(k) is not None and best_total[k].answer == q.place for k, q in enumerate(questions)) / n
    acc_m = sum(best_mean.get(k) is not None and best_mean[k].answer == q.place for k, q in enumerate(questions)) / n
    free = sum(p == q.place for p, q in zip(preds, questions)) / n
    print(
        f"capitalised only={capital}: {len(rows)} candidates, {time.time() - t0:.1f} s; free decoding {free:.3f}, "
        f"best total logprob {acc_t:.3f}, best mean logprob {acc_m:.3f}",
        flush=True,
    )
