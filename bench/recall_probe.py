"""Does a pretrained model know the facts? Recall of each dev person's place from their own document.

    python bench/recall_probe.py vanilla bench/runs/NAME/pretrain.params [more params files]   # or perceiver, rope
    python bench/recall_probe.py vanilla PARAMS --shift "Where was "   # the same, documents moved right
    python bench/recall_probe.py rope PARAMS --answers DEV.predictions   # recall against right answers, per person

For every dev question whose place occurs in the person's wiki.txt document,
the model reads the document up to the place ("Ada Lovelace. She was born in ")
and must continue with the place itself: exact match of every character under
greedy decoding (teacher-forced argmax over the place's characters, which is
the same thing). That is plain language modelling, the first part of every
span-corruption example, so it measures what pretraining stored, before
finetuning has to teach the question format. Comparing it with the dev
accuracy after finetuning separates "not memorised" from "memorised but not
recalled through the question". --shift puts a text before every document:
the facts are the same, only their positions and the context before them
change, so a drop measures how much the stored facts are tied to the absolute
positions at which pretraining saw them (in a question the name starts at
position 10). Recall is also split by where the place ends, within the first
64 characters or beyond: a perceiver with m = 64 sees only the first 64
inputs, whatever it predicts. --answers takes the dev predictions of the
model finetuned from these params (one per dev line) and splits the people by
recall: how often those recalled are answered right, and those not recalled.
Results are printed and appended to bench/results/recall_probe.jsonl.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from confidence import person_name  # noqa: E402
from dataset import CharCorruptionDataset, read_questions, read_text  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from utils import torch_load_safe  # noqa: E402

BLOCK = 128


def probes(wiki: str, dev_path: Path) -> list[tuple[str, str, int]]:
    """(document prefix, place, dev line index) for each dev question whose place occurs within the block
    of its document."""
    docs = {}
    for line in wiki.split("\n"):
        name = line.split(".", 1)[0]
        docs.setdefault(name, line)
    out = []
    for line, q in enumerate(read_questions(dev_path, require_place=True)):
        if q is None or (name := person_name(q.text)) is None or name not in docs:
            continue
        doc = docs[name]
        # The first occurrence after the name itself ("Paris Hilton. ..." is not about the place).
        at = doc.find(q.place, len(name) + 1)
        if 0 < at and at + len(q.place) <= BLOCK - 1:
            out.append((doc[:at], q.place, line))
    return out


@torch.no_grad()
def recall(model: GPT, ds: CharCorruptionDataset, items: list[tuple[str, str]]) -> list[bool]:
    """For each item: does the model produce its place, character for character, after the prefix?"""
    hits = []
    for prefix, place in items:
        ids = torch.tensor([ds.vocab.encode(prefix + place)])
        logits, _ = model(ids[:, :-1])
        guess = logits[0, len(prefix) - 1 :].argmax(-1)
        hits.append(bool((guess == ids[0, len(prefix) :]).all()))
    return hits


def main() -> None:
    argv = sys.argv[1:]
    options = {"--shift": "", "--answers": None}
    for flag in options:
        if flag in argv:
            at = argv.index(flag)
            options[flag] = argv[at + 1]
            del argv[at : at + 2]
    shift, answers = options["--shift"], options["--answers"]
    if len(argv) < 2 or argv[0] not in ("vanilla", "perceiver", "rope"):
        sys.exit(__doc__)
    wiki = read_text(ROOT / "data" / "wiki.txt")
    ds = CharCorruptionDataset(wiki, BLOCK)
    found = [(shift + prefix, place, line) for prefix, place, line in probes(wiki, ROOT / "data" / "birth_dev.tsv")]
    found = [(prefix, place, line) for prefix, place, line in found if len(prefix) + len(place) <= BLOCK - 1]
    items = [(prefix, place) for prefix, place, _ in found]
    predicted = read_text(answers).split("\n") if answers else []  # the finetuned model's, one per dev line
    for path in argv[1:]:
        state = torch_load_safe(path)
        m = state["down_block.C"].size(1) if "down_block.C" in state else 32  # the bottleneck size
        config = GPTConfig(ds.vocab_size, variant=argv[0], bottleneck_dim=m)
        model = GPT(config)
        model.load_state_dict(state)
        model.eval()
        hits = recall(model, ds, items)
        r = sum(hits) / len(hits)
        # Split at 64 characters: the perceiver's bottleneck (m = 64) sees only the first 64 inputs.
        near = [h for h, (prefix, place) in zip(hits, items, strict=True) if len(prefix) + len(place) <= 64]
        far = [h for h, (prefix, place) in zip(hits, items, strict=True) if len(prefix) + len(place) > 64]
        print(f"{path}: recall from the document {100 * r:.1f}% of {len(items)} dev people (shift {shift!r})")
        print(f"  place ending within 64 characters: {100 * sum(near) / max(1, len(near)):.1f}% of {len(near)}")
        print(f"  beyond: {100 * sum(far) / max(1, len(far)):.1f}% of {len(far)}")
        where = Path(path).resolve()
        shown = str(where.relative_to(ROOT)) if where.is_relative_to(ROOT) else f"{where.parent.name}/{where.name}"
        record = {"date": time.strftime("%Y-%m-%d %H:%M"), "variant": argv[0], "params": shown, "shift": shift}
        record |= {"items": len(items), "recall": round(r, 4)}
        record |= {"items_within_64": len(near), "recall_within_64": round(sum(near) / max(1, len(near)), 4)}
        if answers:
            right = [predicted[line] == place for _, place, line in found]
            recalled = [r for r, h in zip(right, hits, strict=True) if h]
            missed = [r for r, h in zip(right, hits, strict=True) if not h]
            print(f"  answered right: {sum(recalled)} of {len(recalled)} recalled, {sum(missed)} of {len(missed)} not")
            record |= {"answers": answers, "right_when_recalled": [sum(recalled), len(recalled)]}
            record |= {"right_when_not_recalled": [sum(missed), len(missed)]}
        with open(ROOT / "bench" / "results" / "recall_probe.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
