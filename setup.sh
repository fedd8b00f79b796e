#!/usr/bin/env bash
# Set-up shared by run.sh and test.sh: a virtual environment in .venv with the
# pinned dependencies, and the data step. Safe to run again: it skips what is done.
# Usage: source setup.sh [dev]     (dev: also pytest and ruff)
# Sourced, it leaves the caller's shell options alone: the steps run in a subshell with
# their own `set -euo pipefail`, and a failure returns 1 instead of closing the shell. All it
# changes is PATH (.venv/bin first); `source .venv/bin/activate` gives a shell the whole venv.
_setup_root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if ! (
  set -euo pipefail
  ROOT=$_setup_root
  PYTHON="${PYTHON:-python3}"
  if [ ! -x "$ROOT/.venv/bin/python" ]; then
    echo "setup: creating $ROOT/.venv with $($PYTHON --version)"
    "$PYTHON" -m venv "$ROOT/.venv"
  fi
  REQ="$ROOT/requirements.txt"
  [ "${1:-}" = "dev" ] && REQ="$ROOT/requirements-dev.txt"
  # The stamp hashes the requirements' contents, not their paths: a moved checkout needs no reinstall.
  STAMP="$ROOT/.venv/.installed-$(basename "$REQ")-$(cat "$REQ" "$ROOT/requirements.txt" | sha256sum | cut -c1-12)"
  if [ ! -f "$STAMP" ]; then
    echo "setup: installing $(basename "$REQ")"
    "$ROOT/.venv/bin/python" -m pip install -q --upgrade pip
    "$ROOT/.venv/bin/python" -m pip install -q -r "$REQ"
    touch "$STAMP"
  fi
  "$ROOT/.venv/bin/python" "$ROOT/data/get_data.py"
); then
  unset _setup_root
  return 1 2>/dev/null || exit 1
fi
export PATH="$_setup_root/.venv/bin:$PATH"
unset _setup_root
