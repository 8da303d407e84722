#!/usr/bin/env bash
# Builds flashcourse and runs every test: the default build (CPU stages, CUDA code compiled and
# linked when nvcc is present, GPU tests skipped without a GPU, the docs built and checked in
# headless Chromium), then the CPU tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --tests

jobs=$(nproc)
echo "== default build =="
cmake --preset default
cmake --build --preset default -j "$jobs"
ctest --preset default -j "$jobs"

echo "== AddressSanitizer + UndefinedBehaviorSanitizer =="
cmake --preset asan
cmake --build --preset asan -j "$jobs"
ctest --preset asan -j "$jobs"
