#!/usr/bin/env bash
# The test command: set up (if needed), lint, the whole test suite, then the tests that compute again under the
# kernels of other CPUs (tests/kernel_matrix.py).
#   bash test.sh            (extra arguments go to pytest, e.g. bash test.sh -k london)
set -euo pipefail
cd "$(dirname "$0")"
source ./setup.sh dev
ruff format --check .
ruff check .
python -m pytest "$@"
python tests/kernel_matrix.py "$@"
