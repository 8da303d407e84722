#!/usr/bin/env bash
# Installs the Debian packages flashcourse needs, only those missing.
#   scripts/install-deps.sh            build and run the course (compiler, CMake, Eigen, CLI11, doctest,
#                                      nlohmann-json, docs)
#   scripts/install-deps.sh --tests    also what the tests need (headless Chromium for the docs check,
#                                      clang with libFuzzer for the fuzz test of the .npy reader)
# CUDA is optional and not a Debian package here: with nvcc on PATH the GPU stages build too.
#
# On a machine without package access (a rented GPU server, an image of another distribution),
# put Eigen, CLI11, doctest and nlohmann-json where CMake finds them (e.g. unpack the Debian
# packages and set CMAKE_PREFIX_PATH) and set FA_SKIP_INSTALL=1. When an install fails outside CI,
# this script says what is missing and lets the build go on: the configure step then names any
# dependency it still cannot find, and leaves out only what needs it (the docs without Doxygen).
# Under CI a failed install is an error.
set -euo pipefail

if [[ -n "${FA_SKIP_INSTALL:-}" ]]; then
    echo "install-deps: FA_SKIP_INSTALL is set: installing nothing"
    exit 0
fi

packages=(g++ cmake ninja-build libeigen3-dev libcli11-dev doctest-dev nlohmann-json3-dev
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

# Outside CI a failed install is reported, not fatal (see the top of this file).
give_up() {
    echo "install-deps: could not install: ${missing[*]}" >&2
    if [[ -n "${CI:-}" ]]; then exit 1; fi
    echo "install-deps: going on without them; the configure step says what it cannot find" >&2
    exit 0
}
command -v apt-get >/dev/null || { echo "install-deps: no apt-get here (not a Debian-like system)" >&2; give_up; }
sudo=""
if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; give_up; }
    sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# A fresh machine has no package lists yet; refresh them once if the first try cannot find a package.
if ! $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/flashcourse-apt.log 2>&1; then
    $sudo apt-get update -qq || give_up
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/flashcourse-apt.log 2>&1 ||
        { cat /tmp/flashcourse-apt.log >&2; give_up; }
fi
