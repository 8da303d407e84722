#!/bin/sh
# Runs a stage executable on q, k, v written by make_npy_inputs into a fresh directory, and passes
# when it exits with the expected code and its output matches a pattern (grep -E):
#
#   loaded_exit_test.sh MAKE_NPY_INPUTS SHAPE MAGNITUDE SEED CODE REGEX STAGE [ARGS...]
#
# SHAPE is B,H,Nq,Nk,d; q and k are MAGNITUDE times standard normal (seed SEED), v standard normal.
make_inputs=$1 shape=$2 magnitude=$3 seed=$4 code=$5 regex=$6 stage=$7
shift 7
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
"$make_inputs" "$dir" --shape "$shape" --magnitude "$magnitude" --seed "$seed" || exit 1
out=$("$stage" --load "$dir" "$@" 2>&1)
rc=$?
printf '%s\n' "$out"
echo "exit code $rc, expected $code"
[ "$rc" -eq 77 ] && [ "$code" -ne 77 ] && exit 77  # no GPU for a GPU stage: CTest shows it as skipped
[ "$rc" -eq "$code" ] && printf '%s\n' "$out" | grep -Eq -- "$regex"
