#!/usr/bin/env bash
# The README's test command: set up (idempotent), build, and run every test through ctest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The tests also need the second venv with an older torch (capture in users' environments).
bash "$ROOT/scripts/setup.sh" tests
cd "${ATTNREPLAY_BUILD:-$ROOT/build}"
exec ctest --output-on-failure -j "${ATTNREPLAY_JOBS:-2}"
