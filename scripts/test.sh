#!/usr/bin/env bash
# Builds flashcourse and runs every test: the default build (CPU stages, CUDA code compiled and
# linked when nvcc is present, GPU tests skipped without a GPU, the docs built and checked in
# headless Chromium), then the CPU tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
#
# The build goes on past a target that fails, and the tests run anyway: a test that did not
# build shows as failed ("Not Run") and costs only itself. Warnings are errors under CI (CI set
# in the environment, as CI does) and reported otherwise (FA_WERROR=ON|OFF overrides).
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --tests || exit 1

werror=${FA_WERROR:-$([[ -n "${CI:-}" ]] && echo ON || echo OFF)}
jobs=$(nproc)
status=0
for preset in default asan; do
    if [[ $preset == default ]]; then
        echo "== default build (warnings as errors: $werror) =="
    else
        echo "== AddressSanitizer + UndefinedBehaviorSanitizer =="
    fi
    cmake --preset "$preset" -DFA_WERROR="$werror" || { echo "test: configuring $preset failed"; exit 1; }
    if ! cmake --build --preset "$preset" -j "$jobs" -- -k 0; then
        echo "test: some targets of the $preset build failed to build (errors above); their tests fail below"
        status=1
    fi
    ctest --preset "$preset" -j "$jobs" || status=1
done
exit $status
