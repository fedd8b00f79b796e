"""The baseline: answer "London" to every question, scored like the model.

python london_baseline.py --eval_corpus_path birth_dev.tsv --outputs_path london.dev.predictions
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

from dataset import read_questions, score_places  # noqa: E402
from run import Parser  # noqa: E402
from utils import UserError, check_output_file, find_data_file, refuse_same_file, write_text_atomic  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Score "London" on --eval_corpus_path; 0, or 2 after a one-line error on bad input."""
    p = Parser(prog="london_baseline.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--eval_corpus_path", required=True, help="questions file (birth_dev.tsv, ...)")
    p.add_argument("--outputs_path", default=None, help="also write the predictions, one per input line")
    args = p.parse_args(argv)
    try:
        path = find_data_file(args.eval_corpus_path, "--eval_corpus_path")
        check_output_file(args.outputs_path, "--outputs_path")
        refuse_same_file({"--outputs_path": args.outputs_path}, {"--eval_corpus_path": path})
        entries = read_questions(path, require_place=False)
        predictions = ["London" for q in entries if q is not None]
        if args.outputs_path:
            write_text_atomic(args.outputs_path, "".join("London\n" if q else "\n" for q in entries))
        total, correct = score_places([q for q in entries if q is not None], predictions)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if total > 0:
        print(f"Correct: {float(correct)} out of {float(total)}: {correct / total * 100}%")
    else:
        print(f"Predictions written to {args.outputs_path}; no targets provided")
    return 0


if __name__ == "__main__":
    sys.exit(main())
