"""Muon's Newton-Schulz on the cpu preset's 24 matrices: one matrix at a time (optim.orthogonalize) against
same-shape matrices stacked into batched matmuls. Prints whether the results are identical and each way's
seconds a step. (A dead end: kept only in the commit that removes it; verdict in bench/RESEARCH.md.)"""

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from config import build_model, resolve, trainer_config  # noqa: E402
from optim import make_optimizer, orthogonalize  # noqa: E402

A, B, C = 3.4445, -4.7750, 2.0315


def batched(matrices: list[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """orthogonalize of every matrix, same shapes stacked: (k, s, l) batched matmuls."""
    out: list[torch.Tensor | None] = [None] * len(matrices)
    groups: dict[tuple, list[int]] = {}
    for i, m in enumerate(matrices):
        groups.setdefault(tuple(m.shape), []).append(i)
    for idx in groups.values():
        x = torch.stack([matrices[i] for i in idx]).to(dtype)
        tall = x.size(1) > x.size(2)
        x = x.transpose(1, 2) if tall else x
        x = x / (torch.stack([matrices[i].to(dtype).norm() for i in idx])[:, None, None] + 1e-7)
        for _ in range(5):
            gram = x @ x.transpose(1, 2)
            x = A * x + (B * gram + C * gram @ gram) @ x
        x = x.transpose(1, 2) if tall else x
        for j, i in enumerate(idx):
            out[i] = x[j].to(matrices[i].dtype)
    return out


config = resolve({"function": "pretrain", "variant": "vanilla", "pretrain_corpus_path": "wiki.txt", "preset": "cpu"})
muon = make_optimizer(build_model(config, 100), trainer_config(config, 2937)).muon
torch.manual_seed(0)
mats = [torch.randn(p.shape) for group in muon.param_groups for p in group["params"]]
one = [orthogonalize(m, dtype=muon.ns_dtype) for m in mats]
print("identical:", all(torch.equal(a, b) for a, b in zip(one, batched(mats, muon.ns_dtype))))
for name, f in [("one at a time", lambda: [orthogonalize(m, dtype=muon.ns_dtype) for m in mats]),
                ("batched", lambda: batched(mats, muon.ns_dtype))] * 2:  # fmt: skip
    f()
    t0 = time.perf_counter()
    for _ in range(10):
        f()
    print(f"{name}: {(time.perf_counter() - t0) / 10:.4f} s a step")
