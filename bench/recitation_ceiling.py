"""The share of dev people whose recitation by pretrained params holds their gold place (the recite protocol's
ceiling), for each sweep cell's pretraining: as a reader's evaluation recites, 100 characters after `NAME.`.

    python bench/recitation_ceiling.py OUT_OF_A_SWEEP [--out FILE.jsonl]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from config import BLOCK_SIZE, build_model, resolve  # noqa: E402
from dataset import CharCorruptionDataset, read_questions, read_text  # noqa: E402
from params import load_params, read_sidecar  # noqa: E402
from recite import place_in_recitation, recite  # noqa: E402
from utils import locate_data  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep", help="a bench/sweep.py --out folder")
    p.add_argument("--out", help="append a JSON line per cell here")
    args = p.parse_args(argv)
    corpus = CharCorruptionDataset(read_text(locate_data("wiki.txt")), BLOCK_SIZE)
    questions = [q for q in read_questions(locate_data("birth_dev.tsv"), require_place=True) if q is not None]
    for params in sorted(Path(args.sweep).glob("*/*.pretrain.params")):
        config = read_sidecar(params)["config"]
        model = build_model(resolve({**config, "function": "evaluate"}), corpus.vocab_size)
        load_params(model, corpus.vocab, str(params))
        texts = recite(model, corpus.vocab, questions, 100, torch.device("cpu"), "birth_dev.tsv")
        row = {"cell": params.parent.name, "place_in_recitation": place_in_recitation(questions, texts)}
        print(json.dumps(row))
        if args.out:
            with open(args.out, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
