"""The data step: place the course data files into data/ and verify their SHA-256 sums.

    python data/get_data.py                  # from ../shared/data (or $BIRTHPLACE_DATA_DIR)
    python data/get_data.py --source DIR     # from any folder holding the four course files
    python data/get_data.py --check          # only verify what is already in data/

The source folder holds the course files either directly (flat) or in cs224n-a5/,
and Tiny Shakespeare in tinyshakespeare/input.txt. Tiny Shakespeare is only for the
demo: without it the step says so and succeeds. Files are copied (not linked), so
data/ keeps working if the source moves. A missing course file or an altered file is
a one-line error and exit code 2.
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
DEMO_ONLY = {"tinyshakespeare/input.txt": "the Shakespeare demo (mingpt-demo/)"}
COURSE_ORIGIN = (
    "they come from the CS224N assignment 5 public handout materials (wiki.txt, birth_places_train.tsv, "
    "birth_dev.tsv, birth_test_inputs.tsv)"
)


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


def source_file(source: Path, name: str) -> Path | None:
    """Where `name` (e.g. cs224n-a5/wiki.txt) is in `source`: in its subfolder or directly there (flat)."""
    for candidate in (source / name, source / Path(name).name):
        if candidate.is_file():
            return candidate
    return None


def place(source: Path, dest: Path = DATA_DIR) -> tuple[list[str], list[str]]:
    """Copy every listed file from `source` into `dest` after checking its sum.

    Returns (problems, missing): one-line problems with files found, and the names
    of the files found neither in `dest` nor in `source`.
    """
    problems, missing = [], []
    for name, digest in expected_sums().items():
        dst = destination(name, dest)
        if dst.is_file() and sha256(dst) == digest:
            continue
        if dst.is_symlink() or (dst.exists() and not dst.is_file()):  # a user's link, a folder: never replaced
            problems.append(f"{dst}: not the course file (a link or not a regular file); remove it and rerun")
            continue
        src = source_file(source, name)
        if src is None:
            missing.append(name)
            continue
        if sha256(src) != digest:
            problems.append(f"{src}: SHA-256 does not match data/SHA256SUMS (altered or truncated copy)")
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.tmp")
        try:
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)
        finally:  # a failed copy (a full disk) leaves no temporary behind
            tmp.unlink(missing_ok=True)
        print(f"placed {dst}")
    return problems, missing


def check(dest: Path = DATA_DIR) -> tuple[list[str], list[str]]:
    """(problems, missing) of the files already in `dest`: altered files, and the names of absent ones."""
    problems, missing = [], []
    for name, digest in expected_sums().items():
        dst = destination(name, dest)
        if not dst.is_file():
            missing.append(name)
        elif sha256(dst) != digest:
            problems.append(f"{dst}: SHA-256 does not match data/SHA256SUMS (altered file; delete it and rerun)")
    return problems, missing


def missing_report(missing: list[str], where: Path, fix: str) -> tuple[list[str], list[str]]:
    """(errors, notes), one line each: missing course files are an error saying where they come from;
    a missing demo-only file is a note."""
    course = [Path(name).name for name in missing if name not in DEMO_ONLY]
    errors = [f"course files missing from {where}: {', '.join(course)}; {COURSE_ORIGIN}; {fix}"] if course else []
    notes = [f"{name} not in {where}: only {DEMO_ONLY[name]} needs it" for name in missing if name in DEMO_ONLY]
    return errors, notes


def main(argv: list[str] | None = None) -> int:
    """Place (or with --check verify) the data files; 0, or 2 after one line per problem."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--source",
        type=Path,
        default=Path(os.environ.get("BIRTHPLACE_DATA_DIR", DEFAULT_SOURCE)),
        help="folder holding the course files, flat or in cs224n-a5/, and tinyshakespeare/ "
        "(default: $BIRTHPLACE_DATA_DIR or ../shared/data)",
    )
    p.add_argument("--check", action="store_true", help="only verify the files already in data/")
    p.add_argument("--dest", type=Path, default=DATA_DIR, help="where to place the files (default: this data/ folder)")
    args = p.parse_args(argv)
    if args.dest.exists() and not args.dest.is_dir():
        print(f"error: --dest {args.dest} is not a folder", file=sys.stderr)
        return 2
    try:
        if args.check:
            problems, missing = check(args.dest)
            errors, notes = missing_report(missing, args.dest, "run python data/get_data.py")
        else:
            problems, missing = place(args.source, args.dest)
            fix = "put them in a folder (flat or in cs224n-a5/) and set BIRTHPLACE_DATA_DIR or --source to it"
            errors, notes = missing_report(missing, args.source, fix)
            if not problems and not errors:
                problems, _ = check(args.dest)
    except OSError as e:  # an unreadable source, a folder that cannot be written, a full disk
        print(f"error: {e.filename or args.dest}: {e.strerror or e}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {note}")
    for problem in problems + errors:
        print(f"error: {problem}", file=sys.stderr)
    if problems or errors:
        return 2
    present = "the course files" if notes else "all files"
    print(f"{args.dest}: {present} present, checksums verified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
