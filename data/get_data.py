"""The data step: place the course data files into data/ and verify their SHA-256 sums.

    python data/get_data.py                  # from ../shared/data (or $BIRTHPLACE_DATA_DIR)
    python data/get_data.py --source DIR     # from any folder holding cs224n-a5/ and tinyshakespeare/
    python data/get_data.py --check          # only verify what is already in data/

Files are copied (not linked), so data/ keeps working if the source moves.
A missing or altered file is a one-line error and exit code 1.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent
REPO_ROOT = DATA_DIR.parent
DEFAULT_SOURCE = REPO_ROOT.parent / "shared" / "data"
SUMS_FILE = DATA_DIR / "SHA256SUMS"


def expected_sums() -> dict[str, str]:
    """{'cs224n-a5/wiki.txt': 'hex', ...} from data/SHA256SUMS."""
    sums = {}
    for line in SUMS_FILE.read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            sums[name.strip()] = digest
    return sums


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def destination(name: str, dest: Path = DATA_DIR) -> Path:
    """cs224n-a5/wiki.txt -> data/wiki.txt; tinyshakespeare/input.txt -> data/tinyshakespeare/input.txt."""
    folder, file = name.split("/", 1)
    return dest / file if folder == "cs224n-a5" else dest / folder / file


def place(source: Path, dest: Path = DATA_DIR) -> list[str]:
    """Copy every listed file from `source` into `dest` after checking its sum; returns problems found."""
    problems = []
    for name, digest in expected_sums().items():
        src, dst = source / name, destination(name, dest)
        if dst.is_file() and sha256(dst) == digest:
            continue
        if not src.is_file():
            problems.append(f"{src}: missing (set BIRTHPLACE_DATA_DIR or --source to the folder holding {name})")
            continue
        if sha256(src) != digest:
            problems.append(f"{src}: SHA-256 does not match data/SHA256SUMS (altered or truncated copy)")
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.tmp")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
        print(f"placed {dst}")
    return problems


def check(dest: Path = DATA_DIR) -> list[str]:
    """Problems with the files already in `dest` (empty list: all present and intact)."""
    problems = []
    for name, digest in expected_sums().items():
        dst = destination(name, dest)
        if not dst.is_file():
            problems.append(f"{dst}: missing (run python data/get_data.py)")
        elif sha256(dst) != digest:
            problems.append(f"{dst}: SHA-256 does not match data/SHA256SUMS (altered file; delete it and rerun)")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--source",
        type=Path,
        default=Path(os.environ.get("BIRTHPLACE_DATA_DIR", DEFAULT_SOURCE)),
        help="folder holding cs224n-a5/ and tinyshakespeare/ (default: $BIRTHPLACE_DATA_DIR or ../shared/data)",
    )
    p.add_argument("--check", action="store_true", help="only verify the files already in data/")
    p.add_argument("--dest", type=Path, default=DATA_DIR, help="where to place the files (default: this data/ folder)")
    args = p.parse_args(argv)
    problems = check(args.dest) if args.check else place(args.source, args.dest)
    if not args.check and not problems:
        problems = check(args.dest)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if not problems:
        print(f"{args.dest}: all files present, checksums verified")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
