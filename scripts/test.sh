#!/usr/bin/env bash
# Builds flashcourse and runs every test: the default build (CPU stages, CUDA code compiled and
# linked when nvcc is present, GPU tests skipped without a GPU, the docs built and checked in
# headless Chromium), then the CPU tests again under AddressSanitizer + UndefinedBehaviorSanitizer,
# with the tests that run the GPU kernels on the CPU (the warp emulator).
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
    # The tests that run the GPU kernels on the CPU (tests/*_emulated.cpp) build once, in the sanitizer
    # build, where an index out of bounds in kernel code is caught: they are most of its compile time.
    emulated=$([[ $preset == asan ]] && echo ON || echo OFF)
    cmake --preset "$preset" -DFA_WERROR="$werror" -DFA_EMULATED_TESTS="$emulated" || { echo "test: configuring $preset failed"; exit 1; }
    if ! cmake --build --preset "$preset" -j "$jobs" -- -k 0; then
        echo "test: some targets of the $preset build failed to build (errors above); their tests fail below"
        status=1
    fi
    ctest --preset "$preset" -j "$jobs" || status=1
done
exit $status
