"""Shared fixtures: small data files written per test, and the real data when present."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

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
