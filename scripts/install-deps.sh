#!/usr/bin/env bash
# Installs the Debian packages flashcourse needs, only those missing.
#   scripts/install-deps.sh            build and run the course (compiler, CMake, Eigen, CLI11, doctest, docs)
#   scripts/install-deps.sh --tests    also what the tests need (headless Chromium for the docs check,
#                                      clang with libFuzzer for the fuzz test of the .npy reader)
# CUDA is optional and not a Debian package here: with nvcc on PATH the GPU stages build too.
set -euo pipefail

packages=(g++ cmake ninja-build libeigen3-dev libcli11-dev doctest-dev
          doxygen graphviz doxygen-awesome-css libjs-mathjax python3 python3-matplotlib python3-numpy)
if [[ "${1:-}" == "--tests" ]]; then
    packages+=(chromium clang libclang-rt-dev)
fi

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# A fresh machine has no package lists yet; refresh them once if the first try cannot find a package.
if ! $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/flashcourse-apt.log 2>&1; then
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/flashcourse-apt.log 2>&1 ||
        { cat /tmp/flashcourse-apt.log >&2; exit 1; }
fi
