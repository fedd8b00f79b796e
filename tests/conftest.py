"""Shared fixtures: small data files written per test, and the real data when present."""

from __future__ import annotations

import math
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "src"))
sys.path.insert(0, str(REPO_ROOT))
# The machine's measured choices (src/machine.py) are cached outside the user's own cache folder: the tests
# and the commands they start measure this machine once and share the verdict.
os.environ["XDG_CACHE_HOME"] = str(Path(tempfile.gettempdir()) / f"birthplace-gpt-tests-{os.getuid()}")

DATA_DIR = REPO_ROOT / "data"

PEOPLE = [
    ("Ada Lovelace", "London"),
    ("Carl Gauss", "Brunswick"),
    ("Marie Curie", "Warsaw"),
    ("Alan Turing", "Maida Vale"),
    ("Emmy Noether", "Erlangen"),
    ("Niels Bohr", "Copenhagen"),
    ("Lise Meitner", "Vienna"),
    ("Srinivasa Ramanujan", "Erode"),
]

TINY_MODEL = ["--n_layer", "2", "--n_head", "2", "--n_embd", "32"]

# Two fp32 computations of the same values that add in another order (other kernels, batching, thread counts) round
# differently. A sum of n terms is off by at most n * u times the sum of its terms' sizes (u = eps / 2, the unit
# roundoff), so two such sums differ by at most n * eps of it, and results that pass through sums of `terms` terms in
# all, of values about their own size, by at most terms * eps of their size. The tolerances below are that bound with
# no further margin: real rounding stays far below it, its errors of either sign cancelling.
FP32_EPS = torch.finfo(torch.float32).eps  # 2**-23, about 1.2e-7


def rounding(terms: int) -> float:
    """The relative difference, at most, of two fp32 computations through sums of `terms` terms in all."""
    return terms * FP32_EPS


def rounding_tolerance(terms: int, scale: float | torch.Tensor) -> dict:
    """assert_close's tolerance for two fp32 computations through sums of `terms` terms of values of size `scale`."""
    return {"atol": rounding(terms) * torch.as_tensor(scale).detach().item(), "rtol": 0.0}


def forward_terms(n_layer: int, n_embd: int, n_head: int, length: int) -> int:
    """How many terms the sums on a transformer's way from embeddings to logits add in all, for `length` positions:
    in each layer, two LayerNorms (mean and variance over n_embd), query, key, value, the projection and the MLP's
    first layer (n_embd each), its second layer (4 n_embd), the scores (a head's size), and the softmax and its
    weighted sum (`length` each); then ln_f and the head."""
    return n_layer * (11 * n_embd + n_embd // n_head + 2 * length) + 3 * n_embd


def greedy_lead(next_logits: Callable[[list[int]], torch.Tensor], prompt: list[int], steps: int,
                banned: tuple[int, ...] = (), stop: int | None = None) -> float:  # fmt: skip
    """The smallest lead, relative to the largest logit, of the likeliest token over the next likeliest in `steps` steps
    of greedy decoding after `prompt` (never choosing a token of `banned`, ending once it chooses `stop`);
    next_logits(ids) gives the logits (V,) of the token after ids. Computations of the logits that each differ from the
    exact ones by at most r of the largest logit all make these greedy choices where the lead exceeds 4 r."""
    ids, leads = list(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            logits = next_logits(ids).float().clone()
            scale = logits.abs().max().item()
            logits[list(banned)] = -math.inf
            top = logits.topk(2)
            leads.append((top.values[0] - top.values[1]).item() / scale)
            ids.append(top.indices[0].item())
            if ids[-1] == stop:
                break
    return min(leads)


def gpt_next_logits(model: torch.nn.Module) -> Callable[[list[int]], torch.Tensor]:
    """next_logits for greedy_lead: the model's logits (eval mode) after the last block_size ids, as the handout's
    sampler computes them."""
    block = model.eval().get_block_size()
    return lambda ids: model(torch.tensor([ids[-block:]]))[0][0, -1]


@pytest.fixture
def restore_threads():
    """torch's thread count as it was before the test."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_corpus(tmp_path: Path) -> Path:
    """A wiki.txt-like corpus: one short biography per line, final newline."""
    lines = [f"{name}. Where was {name} born? In {place}, where the work began ." for name, place in PEOPLE]
    path = tmp_path / "wiki.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def tiny_train_tsv(tmp_path: Path) -> Path:
    path = tmp_path / "train.tsv"
    path.write_text("".join(f"Where was {n} born?\t{p}\n" for n, p in PEOPLE), encoding="utf-8")
    return path


@pytest.fixture
def tiny_dev_tsv(tmp_path: Path) -> Path:
    path = tmp_path / "dev.tsv"
    path.write_text("".join(f"Where was {n} born?\t{p}\n" for n, p in PEOPLE[:4]), encoding="utf-8")
    return path


def real_data(name: str) -> Path:
    """Path of a real data file in data/, or skip the test when the data step has not been run."""
    path = DATA_DIR / name
    if not path.is_file():
        pytest.skip(f"{path} not present (run python data/get_data.py)")
    return path
