#!/bin/sh
# Regenerates docs/results/cpu_sweep.jsonl, the CPU data of the docs' results page: the CPU
# stages 01-04 with --bench --json over a range of N (B=1, H=1, d=64, --reference never).
#
#   bench/cpu_sweep.sh [BUILD_DIR [OUT]]      defaults: build, docs/results/cpu_sweep.jsonl
#   bench/cpu_sweep.sh --blocks [BUILD_DIR]   prints stage 04's block-size table of its lesson
#                                             (N = 4096, d = 64: GFLOP/s and % of the GEMM ceiling)
#   bench/cpu_sweep.sh --backward [BUILD_DIR [OUT]]  stage 08's table of its lesson (default OUT:
#                                             docs/results/stage08_table.txt): time, GFLOP/s, % of
#                                             the GEMM ceiling and peak memory against the naive
#                                             backward's P and dS, N = 1024 to 16384, d = 64
#
# Stages 01 and 02 store the N x N score matrix (1-2 GiB at N = 16384) and stage 03 does
# vector-sized work, so their large sizes take tens of seconds and are timed fewer times; the
# whole sweep takes a few minutes on one core. Every run must pass its own check (exit 0), or
# the sweep stops and OUT is left untouched. Run it on an otherwise idle machine: the stages use
# one core, and a busy neighbour shows up in the medians.
set -eu

if [ "${1:-}" = "--blocks" ]; then
    build=${2:-build}
    exe="$build/stages/04_cpu_tiling/stage04_cpu_tiling"
    echo "| Br | Bc = 64 | Bc = 128 | Bc = 256 | Bc = 512 | Bc = 1024 |"
    echo "|---:|---:|---:|---:|---:|---:|"
    for br in 32 64 128 256; do
        line="| $br |"
        for bc in 64 128 256 512 1024; do
            # "bench ... : 93.42 GFLOP/s" and "-> this stage reaches 65% of it (target ...)"
            cell=$("$exe" --seq-q 4096 --seq-k 4096 --head-dim 64 --heads 1 --reference never --bench --repeat 10 \
                       --warmup 2 --block-m "$br" --block-n "$bc" |
                   awk '/^bench/ {g = $(NF-1)} /reaches/ && !p {p = $5} END {printf "%.0f (%s)", g, p}')
            line="$line $cell |"
        done
        echo "$line"
    done
    echo "GFLOP/s (% of the 1024^3 Eigen GEMM measured in the same run); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(date -u +%Y-%m-%d)"
    exit 0
fi

if [ "${1:-}" = "--backward" ]; then
    build=${2:-build}
    out=${3:-docs/results/stage08_table.txt}
    exe="$build/stages/08_cpu_backward/stage08_cpu_backward"
    {
        echo "stage 08, backward only, B=1 H=1 d=64: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), one core, $(date -u +%Y-%m-%d)"
        printf '%7s %-10s %11s %9s %8s %14s %14s %8s\n' N mask "median ms" "GFLOP/s" "% GEMM" "peak RSS +" "naive P, dS" "ratio"
        for mask in "" --causal; do
            for n in 1024 2048 4096 8192 16384; do
                if [ "$n" -ge 8192 ]; then reps="--warmup 0 --repeat 1"; else reps="--warmup 1 --repeat 5"; fi
                # shellcheck disable=SC2086  # $reps and $mask are options on purpose
                "$exe" --batch 1 --heads 1 --head-dim 64 --seq-q "$n" --seq-k "$n" --reference never --bench $reps $mask |
                    awk -v n="$n" -v mask="${mask:+causal}" '
                        function bytes(v, u) { return v * (u == "GiB" ? 2^30 : u == "MiB" ? 2^20 : u == "KiB" ? 2^10 : 1) }
                        /^memory/ { naive = bytes($(NF-1), $NF) }
                        /^peak RSS/ { sub(/\(/, "", $8); extra = bytes($8, $9) }
                        /^bench/ { ms = $4; g = $(NF-1) }
                        /reaches/ { p = $5 }
                        END { printf "%7d %-10s %11.1f %9.1f %8s %11.2f MiB %10.2f GiB %7.3f%%\n",
                                     n, (mask == "" ? "full" : mask), ms, g, p, extra / 2^20, naive / 2^30, 100 * extra / naive }'
            done
        done
        echo "peak RSS +: what the backward allocates (peak resident set during it minus what the process held before);"
        echo "naive P, dS: the two Nq x Nk float32 matrices per head the textbook backward keeps; % GEMM: of the 1024^3"
        echo "Eigen float GEMM measured in the same run"
    } | tee "$out"
    exit 0
fi

build=${1:-build}
out=${2:-docs/results/cpu_sweep.jsonl}
tmp="$out.partial"
rm -f "$tmp"

# run STAGE_EXE N [extra options...]
run() {
    exe=$1
    n=$2
    shift 2
    if [ "$n" -ge 8192 ]; then
        reps="--warmup 0 --repeat 1"
    elif [ "$n" -ge 4096 ]; then
        reps="--warmup 1 --repeat 5"
    else
        reps="--warmup 3 --repeat 20"
    fi
    printf '%-28s N=%-6s %s\n' "$exe" "$n" "$*"
    # shellcheck disable=SC2086  # $reps is two options on purpose
    "$build/stages/$exe" --batch 1 --heads 1 --head-dim 64 --seq-q "$n" --seq-k "$n" --reference never \
        --bench $reps --json "$tmp" "$@" > /dev/null
}

for n in 256 512 1024 2048 4096 8192 16384; do run 01_naive_attention/stage01_naive_attention "$n"; done
for n in 256 512 1024 2048 4096 8192 16384; do run 02_safe_softmax/stage02_safe_softmax "$n"; done
for n in 256 512 1024 2048 4096; do run 03_online_softmax/stage03_online_softmax "$n"; done
for n in 256 512 1024 2048 4096 8192 16384; do run 04_cpu_tiling/stage04_cpu_tiling "$n"; done
# Causal: stage 04 skips the key blocks above the diagonal, about half the work.
for n in 256 512 1024 2048 4096 8192 16384; do run 04_cpu_tiling/stage04_cpu_tiling "$n" --causal; done

mkdir -p "$(dirname "$out")"
mv "$tmp" "$out"
echo "wrote $out ($(wc -l < "$out") records)"
