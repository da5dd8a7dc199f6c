#!/usr/bin/env bash
# Run the test suite (what CI runs):
#
#   bash scripts/test.sh [PYTEST ARGS...]
#
# With no arguments pytest runs the testpaths of pyproject.toml. Any arguments
# (test paths, -k, -m ...) are passed to pytest; paths are relative to the
# repository root. "No tests collected" (pytest exit 5) is a failure here.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ -x .venv/bin/python ]; then
    py=.venv/bin/python
else
    py=${PYTHON:-python3}
fi

rc=0
"$py" -m pytest -q -p no:cacheprovider "$@" </dev/null || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests; that is a failure" >&2
    exit 1
fi
exit "$rc"
