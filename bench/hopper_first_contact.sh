#!/usr/bin/env bash
# Stage 11 on a Hopper GPU, from the smallest piece up: the host maps, each wrapper alone, each
# step of the kernel on one small problem (with a synchronizing check after every launch), a
# timing of the steps beside stage 07, the stage's tests, the wgmma ceiling. Every
# command has a time limit, so a barrier that never completes shows as a timeout (exit 137)
# naming the command, and the rest still runs.
#
# Usage: bench/hopper_first_contact.sh [build-dir] (default build-gpu; configured here when it
# has no build.ninja, and the Hopper targets built). JOBS sets the build's parallelism (default:
# all cores); SKIP_BUILD=1 runs executables built elsewhere (laid out as in a build directory).
# STEPS lists the steps to check (default: every step of the road); TIMED the steps to time
# beside stage 07 (default: 0 and 3 on). BUDGET (seconds, default 170) bounds the whole run: a
# command that would start past it is skipped and says so, and a command's limit never runs past
# it. The output is long: tee it into a file.
set -u
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
jobs=${JOBS:-$(nproc)}
budget=${BUDGET:-170}
all_steps=${STEPS:-1 2 3 4 5 6 7 8}
timed=${TIMED:-0 3 4 5 6 7 8}
SECONDS=0
targets="test_hopper_layouts test_hopper_wrappers test_stage11 stage11_hopper_kernel wgmma_ceiling"
stage11="$build/stages/11_hopper_kernel/stage11_hopper_kernel"

section() { printf '\n=== %s\n' "$*"; }
# run SECONDS COMMAND...: runs it with a time limit (cut to what is left of the budget) and
# prints its exit code; past the budget it runs nothing and says so (exit 125).
run() {
    local limit=$1
    shift
    local left=$((budget - SECONDS))
    if ((left < 3)); then
        printf '$ %s\n[skipped: the %d-second budget is spent]\n' "$*" "$budget"
        last_rc=125
        return
    fi
    ((limit > left)) && limit=$left
    printf '$ %s\n' "$*"
    timeout --signal=KILL "$limit" "$@"
    last_rc=$?
    printf '[exit %d, %d s into the run]\n' "$last_rc" "$SECONDS"
}
last_rc=0

section "GPU and toolkit"
nvidia-smi --query-gpu=name,compute_cap,clocks.sm,clocks.max.sm,driver_version --format=csv 2>&1 | head -3
nvcc --version 2>&1 | tail -1

section "build ($targets)"
if [[ "${SKIP_BUILD:-0}" == 1 ]]; then
    echo "SKIP_BUILD=1: using the executables already in $build"
else
    if [[ ! -f "$build/build.ninja" ]]; then
        cmake -S . -B "$build" -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90 -DFA_BUILD_DOCS=OFF -DFA_WERROR=ON >/dev/null || exit 1
    fi
    ninja -C "$build" -j"$jobs" $targets 2>&1 | grep -v '^\[' | grep -v 'C7520' | tail -30
fi
for t in $targets; do [[ -n "$(find "$build" -name "$t" -type f -perm -u+x | head -1)" ]] || echo "MISSING target $t"; done

section "SASS: stage 11's kernels must use HGMMA (wgmma), stage 07's HMMA (mma.sync)"
if command -v cuobjdump >/dev/null; then
    cuobjdump -sass "$stage11" 2>/dev/null | awk '
        /Function :/ { f = ($3 ~ /stage11/) ? "stage 11" : "other kernels" }
        /HGMMA/ { hg[f]++ } /HMMA/ { hm[f]++ } /UTMALDG/ { tma[f]++ }
        END { for (k in hg) print k ": " hg[k] " HGMMA"; for (k in hm) print k ": " hm[k] " HMMA";
              for (k in tma) print k ": " tma[k] " UTMALDG" }'
    # Registers per kernel (the launch allocation; setmaxnreg moves them between warpgroups), one line each.
    cuobjdump -res-usage "$stage11" 2>/dev/null | grep -A1 'stage11' | grep -v '^--' | paste - - |
        sed -E 's/.*kernelI([^L]*)Li([0-9]+)E.*StepNILi([0-9]+)E.*REG:([0-9]+).*LOCAL:([0-9]+).*/step \3 d=\2 \1: REG \4, LOCAL \5 (spill bytes)/' |
        sed -E 's/ [0-9]+__?([a-z])/ \1/' | sort -t' ' -k2n -k3,3 | head -40
else
    echo "cuobjdump not found"
fi

section "1. host maps (descriptor, swizzle, fragments)"
run 60 "$build/tests/test_hopper_layouts"

section "2. each wrapper alone (TMA, mbarrier, wgmma SS / RS / transposed B)"
run 120 env FA_CUDA_SYNC=1 "$build/tests/test_hopper_wrappers"

section "3. each step on one small problem (d 64 bf16 bhnd; d 128 fp16 bnhd causal, Nq > Nk)"
# A step that runs past its limit (a barrier that never completes) is left out of the tests below.
steps_ok=""
for s in $all_steps; do
    hung=0
    run 30 env FA_CUDA_SYNC=1 "$stage11" --step "$s" --heads 2 --seq-q 200 --seq-k 333 --head-dim 64
    [[ $last_rc -eq 137 ]] && hung=1
    run 30 env FA_CUDA_SYNC=1 "$stage11" --step "$s" --heads 3 --batch 2 --seq-q 300 --seq-k 130 --head-dim 128 \
        --dtype fp16 --layout bnhd --causal
    [[ $last_rc -eq 137 ]] && hung=1
    [[ $hung -eq 0 ]] && steps_ok="${steps_ok:+$steps_ok,}$s"
done
echo "steps that finished: ${steps_ok:-none}"

section "4. timing: steps $timed (those that finished) beside stage 07 (step 0), bf16, B 1 H 16 N 4096"
for d in 64 128; do
    for causal in "" "--causal"; do
        for s in $timed; do
            [[ $s != 0 && ",$steps_ok," != *",$s,"* ]] && continue
            run 30 "$stage11" --step "$s" --heads 16 --seq-q 4096 --seq-k 4096 --head-dim "$d" $causal --bench \
                --repeat 20 --reference never | grep -E '^(\$|\[exit|config|bench|rate|clock|verdict|error)|FAIL'
        done
    done
done

section "5. the stage's tests, one test case at a time, while the budget lasts (steps ${steps_ok:-none})"
if [[ -n "$steps_ok" ]]; then
    # The new steps' own cases first, then the cases every step goes through.
    for tc in "*step 4 (ping-pong*" "*step 5 (softmax*" "*step 6 (heaviest*" "*step 7 (TMA-store*" "*step 8 (three*" \
              "*road: every step*" \
              "*diagonal*" "*writes every output*" "*any finite scale*" "*longer sequences*" "*refuses*" \
              "*agrees with stage 07*" "*step 1 (wgmma*" "*step 2 (TMA*" "*step 3 (producer*"; do
        run 120 env FA_STAGE11_STEPS="$steps_ok" "$build/tests/test_stage11" --test-case="$tc"
    done
fi

section "6. the wgmma ceiling"
run 30 "$build/bench/wgmma_ceiling" --target-ms 5 --repeat 20

section "done in $SECONDS s (budget $budget s)"
