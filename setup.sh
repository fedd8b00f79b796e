#!/usr/bin/env bash
# Set-up shared by run.sh and test.sh: a virtual environment in .venv with the
# pinned dependencies, and the data step. Safe to run again: it skips what is done.
# Usage: source setup.sh [dev]     (dev: also pytest and ruff)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$ROOT/.venv/bin/python" ]; then
  echo "setup: creating $ROOT/.venv with $($PYTHON --version)"
  "$PYTHON" -m venv "$ROOT/.venv"
fi
REQ="$ROOT/requirements.txt"
[ "${1:-}" = "dev" ] && REQ="$ROOT/requirements-dev.txt"
STAMP="$ROOT/.venv/.installed-$(basename "$REQ")-$(sha256sum "$REQ" "$ROOT/requirements.txt" | sha256sum | cut -c1-12)"
if [ ! -f "$STAMP" ]; then
  echo "setup: installing $(basename "$REQ")"
  "$ROOT/.venv/bin/python" -m pip install -q --upgrade pip
  "$ROOT/.venv/bin/python" -m pip install -q -r "$REQ"
  touch "$STAMP"
fi
"$ROOT/.venv/bin/python" "$ROOT/data/get_data.py"
export PATH="$ROOT/.venv/bin:$PATH"
