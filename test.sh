#!/usr/bin/env bash
# The test command: set up (if needed), lint, then the whole test suite.
#   bash test.sh            (extra arguments go to pytest, e.g. bash test.sh -k london)
set -euo pipefail
cd "$(dirname "$0")"
source ./setup.sh dev
ruff format --check .
ruff check .
python -m pytest "$@"
