#!/usr/bin/env bash
# Runs the test suite with the lab's virtualenv; "no tests collected" (pytest exit 5) is a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
.tools/venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "fencelab: error: pytest collected no tests (exit 5): refusing to pass an empty run" >&2
fi
exit "$rc"
