#!/usr/bin/env bash
# One session on a GPU machine: build, test, sanitize, benchmark, profile, record the lesson runs.
#
#   bench/gpu_session.sh STEP...    STEP: build test sanitize quick sweep ncu lessons
#
# Run from the repository root. Logs and results are written under /tmp/fa-session, then packed
# into $OUT/session.tgz (default OUT=/tmp/fa-out) beside a copy of the summary. The Debian
# packages CMake needs (Eigen, CLI11, doctest) are unpacked from .deps/ when present.
set -u -o pipefail
OUT=${OUT:-/tmp/fa-out}
WORK=/tmp/fa-session
BUILD=${BUILD:-build-gpu}
LOGS=$WORK/logs
rm -rf "$WORK" && mkdir -p "$LOGS" "$WORK/results" "$OUT"
status=0
note() { printf '\n===== %s =====\n' "$*" | tee -a "$LOGS/summary.txt"; }
record() { echo "$*" | tee -a "$LOGS/summary.txt"; }

step_build() {
    note "build"
    local prefix=()
    if compgen -G ".deps/*.deb" >/dev/null; then
        mkdir -p /tmp/deps && for f in .deps/*.deb; do dpkg -x "$f" /tmp/deps; done
        prefix=(-DCMAKE_PREFIX_PATH=/tmp/deps/usr)
    fi
    cmake -S . -B "$BUILD" -G Ninja "${prefix[@]}" -DCMAKE_CUDA_ARCHITECTURES=90 -DFA_BUILD_DOCS=OFF >"$LOGS/configure.log" 2>&1 \
        || { record "configure FAILED"; tail -30 "$LOGS/configure.log"; return 1; }
    ninja -C "$BUILD" -j16 -k 0 >"$LOGS/build.log" 2>&1 || { record "build FAILED (some targets)"; grep -B2 -A12 -m3 "error" "$LOGS/build.log"; }
    record "build ok"
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,driver_version,temperature.gpu,power.draw --format=csv | tee -a "$LOGS/summary.txt"
    cuobjdump -res-usage "$BUILD/bench/bench_gpu" 2>&1 | grep -A1 "attention_kernel" | tee "$LOGS/resource_usage.txt" | grep -E "Function|REG" | head -12
}

step_test() {
    note "ctest (all tests)"
    ctest --test-dir "$BUILD" --output-on-failure -j8 >"$LOGS/ctest.log" 2>&1 || status=1
    tail -25 "$LOGS/ctest.log" | tee -a "$LOGS/summary.txt"
}

# Small problems with tails, Nq != Nk, rows and whole query tiles that see no key.
sanitize_cases=(
    "--seq-q 77 --seq-k 93 --heads 2 --head-dim 32"
    "--seq-q 130 --seq-k 70 --heads 1 --head-dim 64 --causal --layout bnhd"
    "--seq-q 300 --seq-k 100 --batch 2 --head-dim 128 --causal"
    "--seq-q 65 --seq-k 129 --head-dim 128 --layout bnhd"
)
step_sanitize() {
    note "compute-sanitizer"
    local exe tool args
    for exe in "$BUILD/stages/05_shared_memory_kernel/stage05_shared_memory_kernel" "$BUILD/stages/06_causal_masking/stage06_causal_masking"; do
        for tool in memcheck racecheck synccheck initcheck; do
            for args in "${sanitize_cases[@]}"; do
                local log="$LOGS/sanitize_$(basename "$exe" | cut -c1-7)_${tool}.log"
                # shellcheck disable=SC2086
                if compute-sanitizer --tool "$tool" --error-exitcode 9 $( [ "$tool" = memcheck ] && echo --leak-check full ) \
                    "$exe" $args --reference never >>"$log" 2>&1; then
                    record "ok    $tool $(basename "$exe") $args"
                else
                    record "FAIL  $tool $(basename "$exe") $args (see $(basename "$log"))"
                    status=1
                fi
            done
            grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|LEAK SUMMARY" "$LOGS/sanitize_$(basename "$exe" | cut -c1-7)_${tool}.log" | sort | uniq -c | tee -a "$LOGS/summary.txt"
        done
    done
}

step_quick() {
    note "quick benchmark"
    PYTHONUNBUFFERED=1 python3 bench/sdpa_compare.py --bench-exe "$BUILD/bench/bench_gpu" --out-dir "$WORK/results/quick" \
        --sizes ${QUICK_SIZES:-2048 8192} --repeat 10 --warmup 2 2>&1 | tee "$LOGS/quick.log" | grep -v "^\[" || status=1
}

step_sweep() {
    note "sweep: stages 05/06 beside PyTorch SDPA"
    PYTHONUNBUFFERED=1 python3 bench/sdpa_compare.py --bench-exe "$BUILD/bench/bench_gpu" --out-dir "$WORK/results" 2>&1 \
        | tee "$LOGS/sweep.log" || status=1
}

step_ncu() {
    note "ncu: stage 05 kernel, B=4 N=4096, d=64 (H=32) and d=128 (H=16), one launch each"
    local args=(--stages 05 --sizes 4096 --head-dims 64 128 --causal no --repeat 1 --warmup 0 --check false
                --schedule-ablation false --json /tmp/ncu.json --csv /tmp/ncu.csv)
    ncu --clock-control none -k regex:attention_kernel --launch-count 2 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
        --section ComputeWorkloadAnalysis --section WarpStateStats \
        "$BUILD/bench/bench_gpu" "${args[@]}" >"$WORK/results/ncu_stage05.txt" 2>&1 || status=1
    grep -E "attention_kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Dynamic Shared|Block Limit" \
        "$WORK/results/ncu_stage05.txt" | tee -a "$LOGS/summary.txt"
    # Counters for the roofline and the shared-memory banks (a separate run: a metric this ncu does
    # not know must not cost the report above).
    ncu --clock-control none -k regex:attention_kernel --launch-count 2 \
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,smsp__sass_thread_inst_executed_op_ffma_pred_on.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,smsp__inst_executed.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum \
        "$BUILD/bench/bench_gpu" "${args[@]}" >"$WORK/results/ncu_stage05_metrics.txt" 2>&1 || true
    grep -E "attention_kernel|dram__|lts__|ffma|bank_conflicts|wavefronts|inst_executed.sum|local" "$WORK/results/ncu_stage05_metrics.txt" | tee -a "$LOGS/summary.txt"
    # One file for docs/results/: the commands, then both reports without bench_gpu's own lines
    # (its timings under the profiler's replays mean nothing).
    {
        echo "Nsight Compute on the stage 05 kernel, $(nvidia-smi --query-gpu=name --format=csv,noheader), $(date -u +%F)."
        echo "Commands (bench/gpu_session.sh, step ncu):"
        echo "  ncu --clock-control none -k regex:attention_kernel --launch-count 2 --section SpeedOfLight --section Occupancy"
        echo "      --section LaunchStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats"
        echo "      bench_gpu ${args[*]}"
        echo "  ncu ... --metrics dram__bytes_read.sum,... (second report below)"
        echo
        grep -v -E '^\[ *[0-9]+/ *[0-9]+\]|^(gpu|method|wrote) ' "$WORK/results/ncu_stage05.txt"
        echo
        echo "---- counters (second ncu run, --metrics) ----"
        grep -v -E '^\[ *[0-9]+/ *[0-9]+\]|^(gpu|method|wrote) ' "$WORK/results/ncu_stage05_metrics.txt"
    } >"$WORK/results/ncu_stage05_report.txt"
}

step_lessons() {
    note "lesson runs (LESSON_ARGS)"
    "$BUILD/stages/05_shared_memory_kernel/stage05_shared_memory_kernel" --heads 16 --seq-q 2048 --seq-k 2048 --head-dim 64 --bench \
        >"$WORK/results/stage05_run.txt" 2>&1 || status=1
    "$BUILD/stages/06_causal_masking/stage06_causal_masking" --heads 16 --seq-q 2048 --seq-k 2048 --head-dim 64 --causal --bench \
        >"$WORK/results/stage06_run.txt" 2>&1 || status=1
    tail -n 4 "$WORK/results/stage05_run.txt" "$WORK/results/stage06_run.txt" | tee -a "$LOGS/summary.txt"
}

for step in "$@"; do
    "step_$step" || { status=1; [ "$step" = build ] && break; }
done
note "done, status $status"
tar czf "$OUT/session.tgz" -C "$WORK" logs results 2>/dev/null
cp "$LOGS/summary.txt" "$OUT/summary.txt"
exit $status
