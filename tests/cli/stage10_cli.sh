#!/usr/bin/env bash
# Stage 10 on a GPU: packed batches of several kinds pass against float64 and against the dense calls
# one sequence at a time; --save then --load gives the same outputs; --load without cu_seqlens files
# takes --seqlens. Exits 77 (skipped) without a GPU.
# Usage: stage10_cli.sh path/to/stage10_real_models
set -u
exe=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

"$exe" --seqlens 1 --heads 1 --kv-heads 1 >/dev/null 2>&1
[[ $? -eq 77 ]] && { echo "skipped: $(basename "$exe") needs a GPU"; exit 77; }

source "$(dirname "$0")/expect.sh"

expect 0 "verdict +PASS" # the default: a mixed batch, Hq/Hk = 4
expect 0 "verdict +PASS" --seqlens 0,1,7,131,1,37,2 --seqlens-k 5,1,13,131,2,29,0 --heads 4 --kv-heads 2 --causal --dtype fp16
expect 0 "verdict +PASS" --seqlens 263,1,2,3,5,300 --heads 4 --kv-heads 1 --head-dim 128 --window 40,0 --deterministic
expect 0 "verdict +PASS" --seqlens 97,1,61,0,19 --seqlens-k 53,64,61,3,23 --heads 2 --kv-heads 2 --head-dim 32 --window 20,7 \
    --softcap 5 --scale -0.3 --dtype fp16
expect 0 "verdict +PASS" --seqlens 200,17 --heads 4 --kv-heads 2 --inputs large --softcap 30 --causal
expect 0 "verdict +PASS" --seqlens 70,129,3 --heads 2 --kv-heads 1 --head-dim 256 --forward-only --dropout 0.1 \
    --dropout-seed 7 --causal
expect 0 "dropout_mask" --seqlens 70,29 --heads 2 --kv-heads 1 --forward-only --dropout 0.25 --dropout-seed 3 --save "$work"
[[ -s "$work/dropout_mask.npy" ]] || { echo "FAIL: no dropout_mask.npy"; failures=$((failures + 1)); }
rm -f "$work"/*.npy

# --save then --load: the same outputs.
mkdir -p "$work/a" "$work/b" "$work/c"
expect 0 "verdict +PASS" --seqlens 33,1,90 --seqlens-k 47,5,90 --heads 4 --kv-heads 2 --causal --deterministic --save "$work/a"
expect 0 "loaded from" --load "$work/a" --causal --deterministic --save "$work/b"
for f in q k v do o lse dq dk dv cu_seqlens_q cu_seqlens_k; do
    cmp -s "$work/a/$f.npy" "$work/b/$f.npy" || { echo "FAIL: $f.npy differs after --load"; failures=$((failures + 1)); }
done
# Without cu_seqlens files the lengths come from --seqlens, and must add up to the rows.
cp "$work/a/q.npy" "$work/a/k.npy" "$work/a/v.npy" "$work/c/"
expect 0 "lengths from --seqlens" --load "$work/c" --seqlens 33,1,90 --seqlens-k 47,5,90 --causal
expect 2 "add up to 123 queries but q.npy has 124 rows" --load "$work/c" --seqlens 33,1,89 --seqlens-k 47,5,90

if [[ $failures -ne 0 ]]; then
    echo "$failures stage 10 check(s) failed"
    exit 1
fi
echo "all stage 10 checks passed"
