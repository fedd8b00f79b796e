"""Do models know the same facts? Which dev questions each answers right, pairwise and all together.

    python bench/agreement.py vanilla=outputs/vanilla.pretrain.dev.predictions rope=outputs/rope.pretrain.dev.predictions
    python bench/agreement.py --record "run.sh models" vanilla=... perceiver=... rope=...

For each predictions file (one prediction per line of the gold file): its dev
accuracy; for each pair, the questions right in both and in either; for all of
them, the questions at least one gets right. That last figure is the ceiling of
any way of choosing one answer per question among these models (an oracle that
knew which model to trust): the knowledge is in the models, the question is how
to get it out. --record appends the figures to bench/results/agreement.jsonl.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "src"))

from dataset import Question, read_questions, read_text  # noqa: E402
from utils import UserError  # noqa: E402

AGREEMENT_JSONL = REPO_ROOT / "bench" / "results" / "agreement.jsonl"


def right_answers(entries: list[Question | None], gold: Path, predictions: Path) -> set[int]:
    """Indices (among the gold file's questions) of the questions `predictions` answers exactly right.

    entries: the gold file as read_questions gives it, one per line (None for a blank line).
    """
    lines = read_text(predictions).split("\n")
    lines = lines[:-1] if lines and lines[-1] == "" else lines
    if len(lines) != len(entries):
        raise UserError(f"{predictions}: {len(lines)} lines, but {gold} has {len(entries)}")
    questions = [(q, p) for q, p in zip(entries, lines, strict=True) if q is not None]
    return {i for i, (q, p) in enumerate(questions) if p == q.place}


def agreement(right: dict[str, set[int]], total: int) -> dict:
    """{accuracy: {name: fraction}, pairs: [{models, both, either}], any: count, total} from each model's
    set of right answers among `total` questions."""
    return {
        "total": total,
        "accuracy": {name: len(r) / total for name, r in right.items()},
        "pairs": [
            {"models": [a, b], "both": len(right[a] & right[b]), "either": len(right[a] | right[b])}
            for a, b in itertools.combinations(right, 2)
        ],
        "any": len(set().union(*right.values())),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+", metavar="NAME=PREDICTIONS", help="a name and its dev predictions file")
    p.add_argument("--gold", default=str(REPO_ROOT / "data" / "birth_dev.tsv"), help="dev questions with places")
    p.add_argument("--record", metavar="LABEL", help="append the figures under LABEL to bench/results/agreement.jsonl")
    args = p.parse_args(argv)
    try:
        if any("=" not in m for m in args.models):
            raise UserError("each model is NAME=PREDICTIONS_FILE")
        paths = dict(m.split("=", 1) for m in args.models)
        entries = read_questions(args.gold, require_place=True)
        right = {name: right_answers(entries, Path(args.gold), Path(path)) for name, path in paths.items()}
        total = sum(q is not None for q in entries)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    figures = agreement(right, total)
    for name, acc in figures["accuracy"].items():
        print(f"{name}: {len(right[name])}/{total} ({acc:.1%})")
    for pair in figures["pairs"]:
        a, b = pair["models"]
        print(f"{a} and {b}: both {pair['both']}, either {pair['either']} ({pair['either'] / total:.1%})")
    print(f"right in at least one: {figures['any']}/{total} ({figures['any'] / total:.1%})")
    if args.record:
        line = {"label": args.record, "date": datetime.date.today().isoformat(), "models": paths, **figures}
        with open(AGREEMENT_JSONL, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
        print(f"appended to {AGREEMENT_JSONL}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
