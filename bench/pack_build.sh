#!/usr/bin/env bash
# Packs executables of a CUDA build for a GPU machine whose time is better spent running them than
# compiling them (bench/session.py's experiment prebuilt unpacks them there:
# `python3 bench/session.py run prebuilt road11 --no-build`):
#
#   bench/pack_build.sh [-b BUILD] [-o ARCHIVE] PATH...
#
# PATH: an executable relative to BUILD (default build-gpu), e.g. bench/bench_gpu,
# stages/11_hopper_kernel/stage11_hopper_kernel, tests/test_stage11. ARCHIVE (default
# .carry/build.txz, git-ignored) keeps those relative paths, xz-compressed.
#
# The build must have been configured with -DFA_NATIVE=OFF: with -march=native the host code may
# use instructions of this CPU that the GPU machine's lacks. The CUDA code is compiled for the
# architectures the build names (CMAKE_CUDA_ARCHITECTURES; stage 11 for sm_90a), with this
# machine's nvcc, whose runtime the GPU machine's driver must support.
set -euo pipefail
build="build-gpu"
archive=".carry/build.txz"
while getopts "b:o:" opt; do
    case $opt in
        b) build=$OPTARG ;;
        o) archive=$OPTARG ;;
        *) echo "usage: bench/pack_build.sh [-b BUILD] [-o ARCHIVE] PATH..." >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
if [ $# -eq 0 ]; then
    echo "pack_build: name the executables to pack, relative to $build (e.g. bench/bench_gpu)" >&2
    exit 2
fi
cache=$build/CMakeCache.txt
[ -f "$cache" ] || { echo "pack_build: $build is not a configured build folder (no CMakeCache.txt)" >&2; exit 2; }
if grep -q '^FA_NATIVE:BOOL=ON' "$cache"; then
    echo "pack_build: $build was configured with FA_NATIVE=ON (-march=native for this CPU); reconfigure with -DFA_NATIVE=OFF" >&2
    exit 2
fi
for f in "$@"; do
    [ -x "$build/$f" ] || { echo "pack_build: no executable $build/$f (build it first)" >&2; exit 2; }
done
mkdir -p "$(dirname "$archive")"
tar -cf - -C "$build" "$@" | xz -T0 -6 >"$archive.part"
mv -f "$archive.part" "$archive"
size=$(stat -c %s "$archive")
echo "pack_build: $archive, $size bytes: $*"
# Device code hardly compresses: bench_gpu alone is some 30 MB packed.
[ "$size" -lt $((56 << 20)) ] || echo "pack_build: $archive is over 56 MiB; pack fewer executables if it is slow to copy" >&2
