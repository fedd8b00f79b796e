#!/usr/bin/env bash
# Set-up shared by run.sh and test.sh: a virtual environment in .venv with the
# pinned dependencies, and the data step. Safe to run again: it skips what is done.
# Usage: source setup.sh [dev]     (dev: also pytest and ruff)
#        bash setup.sh [dev]       (the same steps, without changing the calling shell)
# The steps run as their own bash process with `set -euo pipefail`, so the first failed step
# stops them (bash ignores `set -e` in a subshell whose status an `if` tests). Sourced, a
# failure returns 1 instead of closing the shell, and all it changes is PATH (.venv/bin
# first); `source .venv/bin/activate` gives a shell the whole venv.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  ROOT="$(cd "$(dirname "$0")" && pwd)"
  PYTHON="${PYTHON:-python3}"
  if [ ! -x "$ROOT/.venv/bin/python" ]; then
    if [ -e "$ROOT/.venv" ] || [ -L "$ROOT/.venv" ]; then
      echo "setup: $ROOT/.venv exists but holds no Python; remove it and run again" >&2
      exit 1
    fi
    echo "setup: creating $ROOT/.venv with $($PYTHON --version)"
    "$PYTHON" -m venv "$ROOT/.venv"
  fi
  REQ="$ROOT/requirements.txt"
  [ "${1:-}" = "dev" ] && REQ="$ROOT/requirements-dev.txt"
  # The stamp hashes the requirements' contents, not their paths: a moved checkout needs no reinstall.
  STAMP="$ROOT/.venv/.installed-$(basename "$REQ")-$(cat "$REQ" "$ROOT/requirements.txt" | sha256sum | cut -c1-12)"
  if [ ! -f "$STAMP" ]; then
    # Torch is most of it: say so before pip's first line, which is slow to come.
    echo "setup: installing torch and the other packages of $(basename "$REQ") into .venv" \
      "(about 1.1 GB on disk, most of it torch; a minute or more)..."
    "$ROOT/.venv/bin/python" -m pip install -q --upgrade pip
    # Not -q: pip names each package as it collects it, and shows a bar for what it downloads.
    "$ROOT/.venv/bin/python" -m pip install --progress-bar on -r "$REQ"
    touch "$STAMP"
    echo "setup: .venv ready after $((SECONDS / 60)) min $((SECONDS % 60)) s; it holds $(du -sh "$ROOT/.venv" | cut -f1)"
  fi
  "$ROOT/.venv/bin/python" "$ROOT/data/get_data.py"
  exit 0
fi
_setup_root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if ! bash "$_setup_root/setup.sh" "$@"; then
  unset _setup_root
  return 1 2>/dev/null || exit 1
fi
export PATH="$_setup_root/.venv/bin:$PATH"
unset _setup_root
