"""Where a perceiver's projections look: the attention of its down- and up-projection on real examples.

    python bench/perceiver_attention.py bench/runs/NAME/pretrain.params [more params files]

Reads 64 corrupted wiki.txt examples (seed 0, the handout's corruption) and
reports, over heads, examples and the first m positions: how much
bottleneck position i attends to input i (down), and how much output t
attends to bottleneck positions t, t-1, t-2 and t-3 (up). A handout-initialised
perceiver starts near 1/(i+1) on each; `--perceiver_init aligned` starts
near 1 on the diagonal. Printed, and appended to
bench/results/perceiver_attention.jsonl.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from dataset import CharCorruptionDataset, read_text  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402


def offset_means(weights: torch.Tensor, m: int, offsets: range) -> list[float]:
    """Mean attention of query t on key t - d, for each d in offsets, over queries d..m-1: (B, nh, T, K) -> floats."""
    return [torch.diagonal(weights[..., :m, :m], offset=-d, dim1=-2, dim2=-1).mean().item() for d in offsets]


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    ds = CharCorruptionDataset(read_text(ROOT / "data" / "wiki.txt"), 128)
    torch.manual_seed(0)
    idx = torch.stack([ds[i][0] for i in range(64)])
    for path in sys.argv[1:]:
        state = torch.load(path, map_location="cpu")
        m = state["down_block.C"].size(1)
        model = GPT(GPTConfig(vocab_size=ds.vocab_size, perceiver=True, bottleneck_dim=m)).eval()
        model.load_state_dict(state)
        down, up = model.projection_attention(idx)
        record = {"date": time.strftime("%Y-%m-%d %H:%M"), "params": path, "bottleneck_dim": m}
        record["down_on_own_position"] = round(offset_means(down, m, range(1))[0], 3)
        record["up_on_t_minus"] = [round(w, 3) for w in offset_means(up, m, range(4))]
        print(
            f"{path}: bottleneck i on input i {record['down_on_own_position']:.2f}; "
            f"output t on bottleneck t, t-1, t-2, t-3: {', '.join(f'{w:.2f}' for w in record['up_on_t_minus'])}"
        )
        with open(ROOT / "bench" / "results" / "perceiver_attention.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
