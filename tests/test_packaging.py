"""Specification of the project's declaration: building it gives metadata only, never top-level modules."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO_ROOT


def test_building_the_project_gives_a_wheel_of_metadata_without_top_level_modules(tmp_path):
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 64:
        pytest.skip(f"setuptools {setuptools.__version__} is older than pyproject.toml's build requirement")
    tree = tmp_path / "checkout"
    tree.mkdir()
    for name in ("pyproject.toml", "requirements.txt", "README.md"):
        shutil.copy(REPO_ROOT / name, tree / name)
    shutil.copytree(REPO_ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__"))
    build = [sys.executable, "-m", "pip", "wheel", str(tree), "--no-build-isolation", "--no-deps", "--no-index"]
    proc = subprocess.run(build + ["-w", str(tmp_path / "dist"), "-q"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert wheel.name.startswith("birthplace_gpt-")
    with zipfile.ZipFile(wheel) as z:
        assert all(Path(n).parts[0].endswith(".dist-info") for n in z.namelist()), z.namelist()
        metadata = z.read(next(n for n in z.namelist() if n.endswith("/METADATA"))).decode()
    assert "Requires-Python: >=3.11" in metadata
    requirements = [line for line in (REPO_ROOT / "requirements.txt").read_text().splitlines() if line[:1].isalpha()]
    assert [line[len("Requires-Dist: ") :] for line in metadata.splitlines() if line.startswith("Requires-Dist:")] == (
        requirements
    )
