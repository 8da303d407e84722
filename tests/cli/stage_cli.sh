#!/usr/bin/env bash
# Command-line behaviour of a stage executable: bad options and bad files exit with 2 and a
# message naming the problem; --save followed by --load reproduces the same result; inputs that
# hold NaN or inf are refused before the stage runs.
# Usage: stage_cli.sh path/to/stageNN_executable path/to/make_npy_inputs
set -u
exe=$1
make_inputs=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
# The head dimension of the runs below: 32 unless the stage does not take it (FA_CLI_HEAD_DIM).
hd=${FA_CLI_HEAD_DIM:-32}

# A GPU stage on a machine without a GPU says so and exits 77: skip, as CTest expects.
"$exe" --seq-q 1 --seq-k 1 --heads 1 --head-dim "$hd" >/dev/null 2>&1
[[ $? -eq 77 ]] && { echo "skipped: $(basename "$exe") needs a GPU"; exit 77; }

source "$(dirname "$0")/expect.sh"

expect 2 "--batch" --batch 0
expect 2 "--head-dim" --head-dim 0
expect 2 "--seq-q" --seq-q abc
expect 2 "--layout" --layout nchw
expect 2 "--inputs" --inputs zeros
expect 2 "--scale" --scale nan
expect 2 "needs about .* of host memory" --batch 64 --heads 64 --seq-q 1000000 --seq-k 1000000 --reference never
expect 2 "no-such" --no-such-option

# --save then --load: the same inputs give the same outputs.
mkdir -p "$work/a" "$work/b"
expect 0 "PASS" --heads 2 --seq-q 33 --seq-k 47 --head-dim "$hd" --causal --save "$work/a"
expect 0 "loaded from" --load "$work/a" --causal --save "$work/b"
for f in q k v o lse; do
    cmp -s "$work/a/$f.npy" "$work/b/$f.npy" || { echo "FAIL: $f.npy differs after --load"; failures=$((failures + 1)); }
done
expect 0 "loaded from" --load "$work/a" --layout bnhd --causal

# Files that are wrong in shape or form.
mkdir -p "$work/bad"
cp "$work/a/q.npy" "$work/a/k.npy" "$work/bad/"
cp "$work/a/lse.npy" "$work/bad/v.npy"  # 3 dimensions
expect 2 "4 dimensions" --load "$work/bad"
cp "$work/a/q.npy" "$work/bad/v.npy"    # v with Nq rows, k with Nk rows
expect 2 "must match" --load "$work/bad"
cp "$work/a/v.npy" "$work/bad/v.npy"
head -c 100 "$work/a/k.npy" >"$work/bad/k.npy"
expect 2 "truncated" --load "$work/bad"
printf 'not a numpy file at all' >"$work/bad/k.npy"
expect 2 "magic" --load "$work/bad"
rm "$work/bad/k.npy"
expect 2 "cannot open" --load "$work/bad"
expect 2 "--seq-q 5 disagrees" --load "$work/a" --seq-q 5

# Inputs with large logits, as saved from a model: q and k with entries of magnitude about 30,
# scores in the thousands. The limits follow the scores, so every stage passes against float64;
# stage 01 overflows (its lesson, exit 0), and stage 02 says stage 01 is not comparable there
# instead of failing.
mkdir -p "$work/large"
"$make_inputs" "$work/large" --shape 1,2,100,130,64 --magnitude 30 --seed 7
case "$(basename "$exe")" in
    stage01_*) expect 0 "verdict +OVERFLOW, as this stage teaches" --load "$work/large" ;;
    stage02_*) expect 0 "stage 01 \(naive attention\) overflowed on these inputs .*: not comparable" --load "$work/large"
               expect 0 "verdict +PASS" --load "$work/large" ;;
    *) expect 0 "verdict +PASS" --load "$work/large" ;;
esac
# The limits come from the data: the float32 rule names its score bound; a 16-bit stage's rule names
# the error of naive attention in its precision.
expect 0 "S = [0-9.e+]+ \(bound on \|score\|\)|naive (bf16|fp16): O max_abs|naive [a-z0-9]+ backward: dQ max_abs" \
    --load "$work/large" --layout bnhd

# NaN or inf in the inputs: exit 2 before any stage runs, naming the file, the count and the
# first index; --save writes nothing.
mkdir -p "$work/nan" "$work/inf" "$work/out"
"$make_inputs" "$work/nan" --shape 1,2,33,47,32 --seed 5 --poison q:17,100,2000 --value nan
expect 2 "q\.npy: 3 of 2112 values are NaN or inf \(first at flat index 17, \(b=0, h=0, n=0, x=17\)\)" \
    --load "$work/nan" --save "$work/out"
"$make_inputs" "$work/inf" --shape 1,2,33,47,32 --seed 5 --poison v:1600 --value -inf
expect 2 "v\.npy: 1 of 3008 values are NaN or inf \(first at flat index 1600, \(b=0, h=1, n=3, x=0\)\)" \
    --load "$work/inf" --save "$work/out"
[[ -z "$(ls -A "$work/out")" ]] || { echo "FAIL: --save wrote files for refused inputs"; failures=$((failures + 1)); }

# Backward stages: --save adds dO and the gradients; --load reads do.npy back (the same gradients),
# and a do.npy of the wrong shape, or holding NaN, is refused.
if "$exe" --help 2>&1 | grep -q "backward"; then
    for f in do dq dk dv; do
        [[ -s "$work/a/$f.npy" ]] || { echo "FAIL: --save did not write $f.npy"; failures=$((failures + 1)); }
    done
    for f in dq dk dv; do
        cmp -s "$work/a/$f.npy" "$work/b/$f.npy" || { echo "FAIL: $f.npy differs after --load"; failures=$((failures + 1)); }
    done
    expect 0 "dO loaded from .*do\.npy" --load "$work/a" --causal
    mkdir -p "$work/bad_do"
    cp "$work/a/q.npy" "$work/a/k.npy" "$work/a/v.npy" "$work/bad_do/"
    cp "$work/a/k.npy" "$work/bad_do/do.npy"  # Nk rows, not Nq
    expect 2 "do\.npy has shape .* they must match" --load "$work/bad_do"
    mkdir -p "$work/nan_do"
    "$make_inputs" "$work/nan_do" --shape 1,2,33,47,32 --seed 5 --poison q:5 --value nan
    cp "$work/nan_do/q.npy" "$work/bad_do/do.npy"
    cp "$work/a/q.npy" "$work/a/k.npy" "$work/a/v.npy" "$work/bad_do/"
    expect 2 "do\.npy: 1 of 2112 values are NaN or inf" --load "$work/bad_do"
fi

if [[ $failures -ne 0 ]]; then
    echo "$failures command-line check(s) failed"
    exit 1
fi
echo "all command-line checks passed for $(basename "$exe")"
