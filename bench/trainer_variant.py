"""run.py with the preset's pretraining batched or decayed otherwise: a research tool, not a product flag.

    python bench/trainer_variant.py --order file --decay all_but_biases -- pretrain vanilla wiki.txt --preset cpu ...

--order: bucketed (the cpu preset's), shuffled, or file (the handout's trainer: the same batches in
file order every epoch); --decay: matmul (the cpu preset's) or all_but_biases (the handout's
trainer). On a GPU the handout's recipe reached the course's figures only with both of the
handout's settings (bench/RESEARCH.md); this asks whether either helps the cpu recipe.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import run  # noqa: E402
from dataset import ORDERS  # noqa: E402


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    at = argv.index("--")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--order", choices=ORDERS, default=None)
    p.add_argument("--decay", choices=["matmul", "all_but_biases"], default=None)
    args = p.parse_args(argv[:at])
    for preset in run.PRESETS.values():
        for key in ("order", "decay"):
            if getattr(args, key) is not None:
                preset["pretrain"][key] = getattr(args, key)
    return run.main(argv[at + 1 :])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
