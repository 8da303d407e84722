#!/usr/bin/env bash
# One session on a GPU machine: build, test, sanitize, measure the ceilings, benchmark, profile,
# record the lesson runs.
#
#   bench/gpu_session.sh STEP...
#
#   newcomer   what a reader does on this machine: a fresh copy of the checkout (the working tree
#              without its build folders), the Debian packages from .deps/, then
#              the README's two commands unchanged (scripts/course.sh, scripts/test.sh), each timed;
#              newcomer.txt records the machine, the compilers, the date and every verdict. Run it
#              in every session that changes build files or GPU code.
#   newcomer_test  the README's second command (scripts/test.sh) in that copy: newcomer_test.txt
#   newcomer_test_start, newcomer_wait  the same in two parts, for a machine whose calls are
#              shorter than scripts/test.sh (about 600 s on an H100 machine): the first starts it
#              detached (its log in /tmp/fa-newcomer-test, which a call's fresh /tmp/fa-session
#              leaves alone) and returns; the second, in the same call or a later one on the same
#              machine, waits up to WAIT_S seconds (default 540) and writes newcomer_test.txt, or
#              says it is still running (call it again)
#   prebuilt   instead of build: unpack executables built on another machine (PREBUILT, default
#              .carry/build.txz: paths relative to the build folder, as bench/pack_build.sh packs
#              them) into $BUILD, and list their registers and spills as build does
#   build      configure (stage 07's tuning candidates on unless TUNING=OFF, warnings as errors)
#              and build what the other steps need, stage 11's targets always among them
#              (stage11_hopper_kernel, wgmma_ceiling, test_stage11, test_hopper_wrappers);
#              BUILD_TARGETS="bench_gpu test_stage07" builds that list alone instead (name
#              mma_ceiling and wgmma_ceiling in it too, or the sweeps print no fraction of the ceilings)
#   test       the whole CTest suite (builds everything)
#   test11     the tests of stage 11 and of Hopper's wrappers alone (ctest -R 'hopper|stage11': the
#              host maps, each wrapper, every step's tests, the reading files of steps 1-4 and 9 against
#              the switch kernel bit for bit, the shared-memory map, the stage's run and command line)
#   traps11    stage 11's compiler traps (bench/traps11.py): ptxas's messages and the SASS counts of
#              each trap and its fix, checked: stage11_traps.json, stage11_traps_table.txt
#   sanitize   compute-sanitizer memcheck, racecheck, synccheck, initcheck on stages 05, 06, 07, 09
#              (SANITIZE_STAGES="05 06 07 09" picks which; 11 adds stage 11: tails, Nq != Nk both
#              ways, causal rows that see no key, bnhd, fp16, d 64 and 128, at every step of its
#              road, the number of steps read from stage11_hopper_kernel --help; what the tool
#              says about an instruction it does not support is recorded in the summary;
#              SANITIZE11_STEPS="1 3" picks steps, SANITIZE09_STEPS="0 2" stage 09's main kernels
#              (default: every step its --help names), SANITIZE_TOOLS="memcheck racecheck" tools; 07m adds stage 07's
#              kernels with stage 10's switches, through test_stage07's cases of them: packed
#              batches, grouped heads, windows, the soft cap, dropout; 09m stage 09's through
#              test_stage09's: grouped heads, windows, the soft cap, packed batches, dropout;
#              SANITIZE09M_CASES="-tc=..." other filters)
#   ceiling    mma_ceiling: mma.sync bf16/fp16, ex2.approx, fp32 FMA peak rates; wgmma_ceiling:
#              dense wgmma bf16/fp16 (on a Hopper GPU)
#   road05     stage 05, every step of its road (float32), d 64/128, N 1024/4096, non-causal, each
#              checked against the final kernel: road05/road05.csv and road05_table.txt
#   road       stage 07, every step of its road and every tuning candidate, bf16, d 64/128,
#              N 1024/4096/16384, causal and not, beside SDPA flash and cuDNN: road.csv
#   sweep07    stage 07's final kernel in bf16 and fp16 beside SDPA flash and cuDNN, the full grid;
#              its gpu_sweep.csv keeps the other rows of docs/results/gpu_sweep.csv
#   sweep09    stage 07's forward and stage 09's backward (atomic and deterministic dQ) in bf16 and
#              fp16 beside SDPA flash and cuDNN forward, backward and both, the full grid, with the
#              other main kernels of stage 09's road beside the default one (STEPS09, default 1:
#              rows stage09_step1 and stage09_step1_deterministic, and a table of them against
#              stage09 and SDPA flash, with each step's deterministic / atomic time); stage 07's
#              forward sweep runs again in the same call (SWEEP09_STAGES="07 09"), because the SDPA
#              forward rows are measured again too and stage 07 is compared with them; its
#              gpu_sweep.csv keeps the other rows of docs/results/gpu_sweep.csv
#   switches07 stage 07 with stage 10's switches beside its plain causal kernel, bf16 and fp16, d 64/128,
#              N 4096/16384: grouped heads 8:1 and 4:1, a 4096-key causal window, the soft cap,
#              dropout 0.1 (causal); and one packed batch of mixed lengths (drawn from 128 to 8192,
#              16384 tokens, seed 7) beside a uniform batch of the same tokens, packed and dense:
#              switches07.txt
#   stage10    stage 10's switches forward and backward beside PyTorch SDPA, in one call (about 3 to 4
#              minutes on an H100): stage 07's forward and stage 09's backward (alone and as a pair)
#              with grouped heads 8:1 and 4:1 (and the plain causal kernels, 1:1), a 4096-key causal
#              window, dropout 0.1 (a backward that refuses it is recorded with its reason), bf16 and
#              fp16, d 64/128, N 4096/16384, beside SDPA with enable_gqa pinned to flash, cuDNN and
#              efficient and with flash's dropout; the windows' time over the plain causal kernels'
#              (ours alone: SDPA's flash has no window); switches07's packed batch of mixed lengths
#              beside a uniform batch of the same tokens and SDPA's nested jagged and padded (masked)
#              batches; ROUNDS rounds, STAGE10_REPEAT timed runs (default 10); STAGE10_MODELS
#              (--model07 points), STAGE10_DTYPES and STAGE10_VARLEN=0 (no packed batch) run a part:
#              stage10/stage10.txt (the tables) and stage10/stage10.csv (each ratio, median over rounds)
#   order07    stage 07's packed forward on stage 10's batch of mixed lengths, bf16 and fp16, d 64/128,
#              causal, its blocks entry by entry with the heads innermost (the default when the
#              lengths differ) and head by head (FA_STAGE07_BLOCK_ORDER=heads), ROUNDS rounds
#              interleaved: order07.txt
#   order09    stage 09's backward with grouped heads (8:1, 4:1) under a causal mask, bf16, d 64/128,
#              N 4096/16384, its blocks longest loops first (the default) and head by head
#              (FA_STAGE09_BLOCK_ORDER=heads), ROUNDS rounds interleaved: order09.txt
#   split09    stage 09's backward with grouped heads (8:1, 4:1) under a causal mask, bf16, d 64/128,
#              N 4096/16384, each group of query heads split over S blocks (FA_STAGE09_GROUP_SPLIT:
#              1, 2, 4, 8 where S divides the group, and 0, the rule), ROUNDS rounds interleaved:
#              split09.txt
#   ncusource09  stage 09's packed backward beside the dense one on four 4096-token sequences, bf16,
#              d NCUSOURCE_D (64), causal: Nsight Compute's instructions and warp samples per SASS
#              opcode (bench/ncu_source_diff.py): ncu_source09.txt
#   ncusource11  stage 11's kernel under Nsight Compute's source counters, one launch per NCUSOURCE11
#              entry "step:d:N:causal" (default "default:128:1024:no default:64:1024:no", step
#              "default": the stage's default step), bf16: warp samples by source line and by the
#              kernel's snippets (bench/ncu_source_lines.py): ncu_source11.txt
#   ncuvarlen09  stage 09's backward on a packed batch of equal lengths beside the dense kernel on
#              the same tokens, Nsight Compute, bf16, causal, d 64/128: ncu_varlen09.txt
#   road09     stage 09's whole road in one run: the default main kernel (forward, backward with
#              both dQ modes, the pair) with every other step beside it (the steps read from
#              stage09_backward_kernel --help), those timed by their backward with atomic dQ alone
#              (--steps09-backward-only, the one the road table uses; each still checked by the
#              guard), bf16, d 64/128, N 4096/16384, causal and not, beside SDPA flash and cuDNN,
#              ROUNDS rounds of ROAD09_REPEAT (10) timed runs: road09/stage09_road09.txt, the
#              record of the lesson's road table (copy it to docs/results/), the sweep's table
#              opened by the two lines of its command and its default step, as the other
#              stage09_steps*_quick.txt records are. Three rounds took 396 s on an H200: give it a
#              600 s device call of its own, the build in an earlier call (about 210-260 s)
#   timing     SDPA flash's bf16 forward timed four ways in one process (bench/timing_check.py: the
#              course's events, Triton's do_bench, each run on an idle GPU, a CUDA graph), d 64/128,
#              N 1024/4096/16384, causal and not, ROUNDS rounds: timing_check.txt
#   sweep      every stage beside every SDPA backend, the full grid (as the committed data)
#   quick      the same at two sizes (QUICK_SIZES), 10 runs each; QUICK_STAGES="05 06 07 09" adds
#              stage 09 beside SDPA's backward, 11 stage 11 beside SDPA cuDNN and flash
#   road11     stage 11, every step of its road (step 0: stage 07's final kernel), bf16, d 64/128,
#              N 1024/4096/16384 (ROAD11_SIZES), causal and not, beside SDPA flash and cuDNN, each
#              step checked against stage 07's final kernel: road11/road11.csv and
#              stage11_road_table.txt; ROAD11_STEPS ("0 8 9") and ROAD11_DTYPES ("bf16 fp16") run a part
#   groups11   stage 11's block order under a causal mask: step 5 (head by head) and step 6 (heaviest
#              first across groups of heads) with several L2 budgets per group (GROUP11_MIB, MiB, the
#              largest meaning every head in one group), bf16, d 64/128, N 1024/4096/16384 as in the
#              sweep (B*N = 16384, H*d = 2048) and B 1, H 16, N 4096: groups11/groups11_table.txt
#   timeline11 stage 11's instrumented build: one thread block's marks (stages/11_hopper_kernel/timeline.hpp)
#              at steps TIMELINE11_STEPS (3 4 5 8 9 10) for the shapes TIMELINE11_SHAPES ("d:N:causal" as in
#              the road's sweep, B*N = 16384, H*d = 2048; default 128:4096:0 64:4096:0 128:1024:0
#              64:1024:1), bf16, each timed beside its plain build; docs/make_timeline.py draws each shape
#              and tabulates where each warpgroup's cycles went: timeline11/stage11_timeline_<shape>_step<N>.json,
#              timeline11/timeline_<shape>.svg, timeline11/timeline_table_<shape>.txt. The lesson's figures
#              read docs/results/stage11_timeline_d{64,128}_n4096_step{3,4,5,8}.json and
#              stage11_persistent_<shape>_step{8,9,10}.json (docs/CMakeLists.txt): copy the records there
#   ncu        Nsight Compute on the stage 05 kernel
#   ncu05road  Nsight Compute on every step of stage 05's road, d 64, N 2048: memory throughput,
#              bank conflicts, occupancy, registers, instructions: ncu_stage05_road.txt
#   ncu07      Nsight Compute on the stage 07 final kernel, d 64 and 128, N 4096
#   ncu07road  shared-memory bank conflicts of road steps 1 (ldmatrix) and 2 (swizzle), d 64, N 4096
#   ncucudnn11 Nsight Compute on stage 11's default kernel and on SDPA cuDNN's forward kernel, bf16,
#              at each point d:N:causal of NCUCUDNN11 (default "128:1024:no"; B N = 16384, H d = 2048):
#              first every kernel the cuDNN forward launches, with its time (cudnn_kernels_<point>.csv;
#              the longest is the attention kernel), then that kernel and ours under NCU11_METRICS with
#              their launch (grid, block, registers, shared memory): ncu_stage11_<point>,
#              ncu_cudnn_<point> and the table ncu_cudnn11_<point>.txt
#   ncuflash09 Nsight Compute on stage 09's default backward kernel and on SDPA flash's (PyTorch's
#              FlashAttention-2 bwd kernel, through bench/sdpa_once.py), bf16, N NCUFLASH_N (4096),
#              non-causal, d NCUFLASH_DIMS (64 128), the same counters side by side: ncu_flash09.txt
#   ncu11      Nsight Compute on stage 11's default kernel, bf16, d 64 and 128, N 4096, non-causal:
#              tensor-pipe use (wgmma), stall reasons, registers: ncu_stage11_d64/d128
#   ncu11road  Nsight Compute's counters at every step of stage 11's road (NCU11_STEPS, default all;
#              NCU11_DIMS "64 128"), bf16, N 4096 (NCU11_SIZE), non-causal (NCU11_CAUSAL=yes: causal):
#              the tensor pipe (wgmma), the exp2 pipe, FMA/ALU, issue slots, registers, the epilogue's
#              global stores, stall reasons, one row per step (bench/ncu_steps11.py): ncu_stage11_road.txt
#   ncu09      Nsight Compute on stage 09's main backward kernel (atomic dQ), bf16, d 64 and 128,
#              N 4096, and the time of each of the backward's three kernels; the same report of the
#              warp-tiled kernel (step 1): ncu_stage09_tiled_d64/d128, and of steps 2 and 3 at d 128
#              (NCU09_STEPS): ncu_stage09_step2_d128, ncu_stage09_step3_d128
#   ncu09at    Nsight Compute on stage 09's warp-tiled kernel at each step:d of NCU09_AT (default
#              "2:64 4:64 5:64"), bf16, N 4096, non-causal: ncu_stage09_step<s>_d<d>
#   ncudrop    Nsight Compute on dropout's price: stage 07's forward and stage 09's backward, causal,
#              bf16, N 4096, d NCUDROP_DIMS (default "64 128"), p 0 and 0.1: ncu_stage07_dropout<p>_d<d>,
#              ncu_stage09_dropout<p>_d<d> (pipes, issue slots, stalls)
#   ncugqa     Nsight Compute on stage 09's main backward kernel (atomic dQ), or with
#              NCUGQA_STAGE=07 stage 07's forward kernel, causal, bf16, at d NCUGQA_DIM (default
#              128) and N NCUGQA_N (default 16384): the plain causal kernel and the grouped-heads
#              kernel with 4:1 and 8:1 groups (--model07 G/-1/0), with the SMs' busiest and average
#              active cycles (the blocks' balance), L2's hit rate and DRAM bytes read:
#              ncu_stage<NN>_gqa<G>_d<d>, gqa_price.txt (09) or gqa_price07.txt (07)
#   lessons    the runs the lessons of stages 05, 06, 07, 09 and 10 show
#
# Run from the repository root. Logs and results are written under /tmp/fa-session, then packed
# into $OUT/session.tgz (default OUT=/tmp/fa-out) beside a copy of the summary, after every step
# and every PACK_EVERY seconds (default 30) during one (a call cut short still returns the steps it
# finished, and the logs and results so far of the one it was in); the summary says how long each
# step took. The Debian packages CMake needs (Eigen, CLI11, doctest) are unpacked from .deps/ when
# present. Each call starts a fresh /tmp/fa-session; the build folder ($BUILD, default build-gpu)
# is kept, so `build` is quick when the machine still holds it. The comparisons with SDPA run the
# whole sequence (ours, then SDPA) ROUNDS times (default 3) and report each ratio's median over
# the rounds with its min and max.
set -u -o pipefail
OUT=${OUT:-/tmp/fa-out}
WORK=/tmp/fa-session
BUILD=${BUILD:-build-gpu}
LOGS=$WORK/logs
RESULTS=$WORK/results
KERNEL07=${KERNEL07:-flash_forward_kernel}  # stage 07's kernel, as Nsight Compute filters it
KERNEL09=${KERNEL09:-flash_backward_kernel}  # stage 09's main kernel (between its pre- and postprocessing)
KERNEL09_TILED=flash_backward_tiled_kernel    # stage 09's steps 1 to 3 (bench_gpu --steps09 1 2 3)
ATOMIC09='\(bool\)0>\('  # the instance with atomic dQ, as Nsight Compute demangles it: "..., (bool)0>(fa::stage09::Args<T1>)"
KERNEL11=${KERNEL11:-hopper_forward_kernel}  # stage 11's kernel (every step but 0)
STAGE05=$BUILD/stages/05_shared_memory_kernel/stage05_shared_memory_kernel
STAGE06=$BUILD/stages/06_causal_masking/stage06_causal_masking
STAGE07=$BUILD/stages/07_pipelined_fused_kernel/stage07_pipelined_fused_kernel
STAGE09=$BUILD/stages/09_backward_kernel/stage09_backward_kernel
STAGE10=$BUILD/stages/10_real_models/stage10_real_models
STAGE11=$BUILD/stages/11_hopper_kernel/stage11_hopper_kernel
rm -rf "$WORK" && mkdir -p "$LOGS" "$RESULTS" "$OUT"
STEPS=("$@")
status=0
start_all=$SECONDS
note() { printf '\n===== %s =====\n' "$*" | tee -a "$LOGS/summary.txt"; }
record() { echo "$*" | tee -a "$LOGS/summary.txt"; }

# The ninja targets the chosen steps need: everything when the tests run (they cover every target).
# Stage 11's executable, its tests and the wgmma ceiling come with any list.
build_targets() {
    local s targets=()
    if [ -n "${BUILD_TARGETS:-}" ]; then  # an explicit list (one call's need), stage 11's left out
        printf '%s\n' $BUILD_TARGETS
        return 0
    fi
    for s in "${STEPS[@]}"; do
        case $s in
            test) return 0 ;;  # no list: build all
            sanitize | lessons)
                targets+=(stage05_shared_memory_kernel stage06_causal_masking stage07_pipelined_fused_kernel stage09_backward_kernel
                    test_stage07 stage10_real_models) ;;
            ceiling) targets+=(mma_ceiling) ;;
            test11) targets+=(test_hopper_layouts test_stage11_schedule make_npy_inputs) ;;
            timeline11) targets+=(stage11_hopper_kernel) ;;
            road | road05 | road11 | ncusource11 | ncucudnn11 | groups11 | switches07 | stage10 | order07 | order09 | split09 | sweep07 | sweep09 | sweep | quick | ncu | ncu05road | ncu07 | ncu07road | ncu09 | ncu09at | ncudrop | ncugqa | ncu11 | ncu11road)
                targets+=(bench_gpu mma_ceiling) ;;
        esac
    done
    [ ${#targets[@]} -eq 0 ] && return 0
    targets+=(stage11_hopper_kernel wgmma_ceiling test_stage11 test_stage11_steps test_stage11_smem_map test_hopper_wrappers)
    printf '%s\n' "${targets[@]}" | sort -u
}

step_build() {
    note "build"
    local prefix=() targets
    unpack_deps
    [ -d /tmp/deps/usr ] && prefix=(-DCMAKE_PREFIX_PATH=/tmp/deps/usr)
    # FA_STAGE07_TUNING adds stage 07's candidate tile shapes as extra steps: the road step times them.
    # TUNING=OFF leaves them out (a shorter build, when the session does not run `road`).
    cmake -S . -B "$BUILD" -G Ninja "${prefix[@]}" -DCMAKE_CUDA_ARCHITECTURES=90 -DFA_BUILD_DOCS=OFF \
        -DFA_STAGE07_TUNING="${TUNING:-ON}" -DFA_WERROR=ON \
        >"$LOGS/configure.log" 2>&1 || { record "configure FAILED"; tail -30 "$LOGS/configure.log"; return 1; }
    mapfile -t targets < <(build_targets)
    ninja -C "$BUILD" -j16 -k 0 "${targets[@]}" >"$LOGS/build.log" 2>&1 \
        || { record "build FAILED (some targets)"; grep -B2 -A12 -m3 "error" "$LOGS/build.log"; }
    # The tests' own kernels (namespace fa::test, mangled _ZN2fa4test) check one instruction's result,
    # not speed: a serialized pipeline there is no fault.
    if grep "wgmma.mma_async instructions are serialized" "$LOGS/build.log" | grep -qv "_ZN2fa4test"; then
        record "FAIL  ptxas serialized a wgmma pipeline:"
        grep "wgmma.mma_async instructions are serialized" "$LOGS/build.log" | grep -v "_ZN2fa4test" | sed 's/.*(C75/  (C75/' | sort | uniq -c | head -8 \
            | tee -a "$LOGS/summary.txt"
        status=1
    fi
    record "build ok (${targets[*]:-all targets}; stage 07 tuning candidates ${TUNING:-ON})"
    list_resources
    return 0
}

# The GPU, then the registers, shared memory and local memory (spills) of every kernel instance
# in bench_gpu (or, without it, in stage 11's executable).
list_resources() {
    local exe=$BUILD/bench/bench_gpu
    [ -x "$exe" ] || exe=$STAGE11
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,driver_version,temperature.gpu,power.draw --format=csv | tee -a "$LOGS/summary.txt"
    if [ -x "$exe" ]; then
        cuobjdump -res-usage "$exe" 2>&1 | awk '/Function/ {f = $2; sub(/:$/, "", f)} /REG:/ {print f, $1, $2, $3, $4}' \
            | (c++filt 2>/dev/null || cat) >"$LOGS/resource_usage.txt"
        grep "attention_kernel" "$LOGS/resource_usage.txt" | head -8 | tee -a "$LOGS/summary.txt"
        kernel_resources "stage 07" "$KERNEL07"
        kernel_resources "stage 09" "$KERNEL09"
        kernel_resources "stage 09 step 1" "$KERNEL09_TILED"
        kernel_resources "stage 11" "$KERNEL11"
    fi
    wgmma_serialization_check
}

# ptxas serializes a kernel's wgmma pipeline, with no more than an "info" line in the build log
# (C7514, C7515, C7518: a wgmma issued under a branch, accumulators touched between issue and
# wait, waits that differ between paths), when it cannot prove the pipeline safe: it then waits
# after every wgmma. In SASS that is `gsb0` on every HGMMA, where a pipelined kernel has one per
# wgmma group. It can also move the loop's ring counters and wgmma descriptors out of the uniform
# datapath (a branch it cannot prove warp-uniform is enough: stage 11's step 16), which shows as
# fewer uniform (U*) instructions and more R2UR moves. Each stage 11 kernel instance, after its
# name: uniform instructions, R2UR, STL and LDL (spills), instructions, HGMMA, those with gsb0,
# WARPGROUP.DEPBAR.
wgmma_serialization_check() {
    [ -x "$STAGE11" ] || return 0
    cuobjdump -sass "$STAGE11" 2>/dev/null | awk '
        /Function :/ {if (f != "") print f, u, r, s, n, h, g, d; f = $3; n = 0; h = 0; g = 0; d = 0; u = 0; r = 0; s = 0}
        /\/\*[0-9a-f]+\*\// {
            n++
            op = $0; sub(/^[ \t]*\/\*[0-9a-f]+\*\/[ \t]+/, "", op); sub(/^@!?U?P[0-9T] +/, "", op); sub(/[ .;].*/, "", op)
            if (op ~ /^U/) u++
            if (op == "R2UR") r++
            if (op == "STL" || op == "LDL") s++
        }
        /HGMMA/ {h++; if ($0 ~ /gsb0/) g++}
        /WARPGROUP.DEPBAR/ {d++}
        END {if (f != "") print f, u, r, s, n, h, g, d}' | (c++filt 2>/dev/null || cat) >"$LOGS/wgmma_sass.txt"
    local serialized  # the instances with more than two HGMMA, every one with gsb0
    serialized=$(awk '$(NF - 2) > 2 && $(NF - 2) == $(NF - 1)' "$LOGS/wgmma_sass.txt")
    record "stage 11 SASS: $(wc -l <"$LOGS/wgmma_sass.txt") kernel instances; $(grep -c . <<<"$serialized") with every HGMMA waited for (a serialized wgmma pipeline); uniform instructions, R2UR, spills per instance in wgmma_sass.txt"
    if [ -n "$serialized" ]; then
        sed 's/^/  serialized: /' <<<"$serialized" | head -8 | tee -a "$LOGS/summary.txt"
        status=1
    fi
}

# Executables built elsewhere (bench/pack_build.sh), for a call that would otherwise spend minutes
# building: unpacked into $BUILD as they were laid out there.
step_prebuilt() {
    note "prebuilt: executables from ${PREBUILT:-.carry/build.txz}"
    local archive=${PREBUILT:-.carry/build.txz} f
    [ -f "$archive" ] || { record "prebuilt FAILED: no $archive (bench/pack_build.sh makes it; name its folder in the call's carry)"; return 1; }
    mkdir -p "$BUILD" && tar -xaf "$archive" -C "$BUILD" || { record "prebuilt FAILED: could not unpack $archive"; return 1; }
    while read -r f; do
        [ -f "$BUILD/$f" ] && record "  $f ($(stat -c %s "$BUILD/$f") bytes)"
    done < <(tar -taf "$archive")
    list_resources
}

# Registers and spills of every instance of one kernel in resource_usage.txt. $1: the stage's
# name in the summary; $2: the kernel's name. Spilled registers live in the stack frame (STACK),
# not in LOCAL, which counts local arrays.
kernel_resources() {
    grep "$2" "$LOGS/resource_usage.txt" | awk -v stage="$1" '{for (i = 1; i <= NF; ++i) if ($i ~ /^(REG|STACK|LOCAL):/) {split($i, a, ":"); v[a[1]] = a[2]}
        n++; r = v["REG"] + 0; if (r > maxr) maxr = r; if (minr == "" || r < minr) minr = r; if (v["STACK"] + v["LOCAL"] > 0) spill++}
        END {if (n) printf "%s: %d kernel instances, %d to %d registers per thread, %d with a stack frame (spills)\n", stage, n, minr, maxr, spill}' \
        | tee -a "$LOGS/summary.txt"
    grep "$2" "$LOGS/resource_usage.txt" | grep -v "STACK:0 " | sed 's/^/  spills: /' | head -8 | tee -a "$LOGS/summary.txt" || true
}

# The Debian packages of .deps/ (Eigen, CLI11, doctest: header-only) unpacked once under /tmp/deps.
unpack_deps() {
    if compgen -G ".deps/*.deb" >/dev/null && [ ! -d /tmp/deps/usr ]; then
        mkdir -p /tmp/deps && for f in .deps/*.deb; do dpkg -x "$f" /tmp/deps; done
    fi
}

step_newcomer() {
    note "newcomer: a fresh copy, then the README's two commands"
    local dir=/tmp/fa-newcomer out="$RESULTS/newcomer.txt" t0 rc
    rm -rf "$dir" && mkdir -p "$dir"
    # The working tree as it stands, without build folders, packages or git's own folder (on the
    # device machine .git may be older than the tree it came with, so git archive is not used).
    tar -c --exclude='./build*' --exclude=./.deps --exclude=./.whl --exclude=./.git . | tar -x -C "$dir"
    record "copy: the working tree without build folders, .deps, .git"
    unpack_deps
    {
        echo "A reader's first run on a GPU machine: a fresh copy of flashcourse, then the README's two commands."
        echo "date:     $(date -u '+%F %H:%M UTC')"
        echo "gpu:      $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
        echo "os:       $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-unknown}")"
        echo "c++:      $(c++ --version | head -1)"
        echo "nvcc:     $(nvcc --version 2>/dev/null | tail -1)"
        echo "cmake:    $(cmake --version | head -1)"
        echo "packages: Eigen, CLI11, doctest unpacked from Debian's .deb files (no package access here):"
        echo "          FA_SKIP_INSTALL=1 CMAKE_PREFIX_PATH=/tmp/deps/usr"
    } >"$out"
    # The first command as the README gives it; the environment only says where the packages are.
    t0=$SECONDS
    (cd "$dir" && FA_SKIP_INSTALL=1 CMAKE_PREFIX_PATH=/tmp/deps/usr timeout 900 scripts/course.sh) >"$LOGS/newcomer_course.log" 2>&1
    rc=$?
    echo "scripts/course.sh: exit $rc, $((SECONDS - t0)) s; compiler warnings in its build: $(grep -c 'warning:' "$LOGS/newcomer_course.log")" >>"$out"
    # The CUDA targets the default build chose on this machine (the GPUs nvidia-smi finds).
    echo "cuda targets: $(grep -o 'arch=compute_[0-9a]*,code=\[[^]]*\]' "$dir/build/build.ninja" 2>/dev/null | sort | uniq -c | tr -s ' ' | paste -sd ';')" >>"$out"
    grep -m 10 -A 3 'warning:' "$LOGS/newcomer_course.log" >>"$out"
    grep -E "^== |^verdict|^course:|^lessons:|FAILED|error:" "$LOGS/newcomer_course.log" | head -60 >>"$out"
    tee -a "$LOGS/summary.txt" <"$out"
    [ "$rc" -eq 0 ] || status=1
}

# The README's second command in the copy `newcomer` made (in the same call, or a later call while
# the machine is still held), as a reader runs it after the first: started, then waited for (up to
# its own 1200 s limit; newcomer_test_start and newcomer_wait split it over two calls).
step_newcomer_test() {
    step_newcomer_test_start && WAIT_S=${WAIT_S:-1260} step_newcomer_wait
}

# newcomer_test.txt from $LOGS/newcomer_test.log: $1 the exit status, $2 the seconds it ran.
newcomer_test_report() {
    local out="$RESULTS/newcomer_test.txt"
    {
        echo "scripts/test.sh: exit $1, $2 s ($(date -u '+%F %H:%M UTC')); compiler warnings in its builds: $(grep -c 'warning:' "$LOGS/newcomer_test.log")"
        grep -m 10 -A 3 'warning:' "$LOGS/newcomer_test.log"
        grep -E "^== |tests passed|tests failed|\(Not Run\)|\*\*\*Failed|\*\*\*Skipped|^test: |error:" "$LOGS/newcomer_test.log" | head -80
    } >"$out"
    tee -a "$LOGS/summary.txt" <"$out"
    [ "$1" -eq 0 ] || status=1
}

# newcomer_test in two parts (see the header): the first starts scripts/test.sh detached and returns.
NEWCOMER_TEST_DIR=/tmp/fa-newcomer-test
step_newcomer_test_start() {
    note "newcomer_test_start: scripts/test.sh in the fresh copy, detached"
    local dir=/tmp/fa-newcomer
    [ -x "$dir/scripts/test.sh" ] || { record "newcomer_test_start: no fresh copy: run the step newcomer first"; status=1; return 1; }
    unpack_deps
    rm -rf "$NEWCOMER_TEST_DIR" && mkdir -p "$NEWCOMER_TEST_DIR"
    # setsid: its own session, so that the end of this call's process group does not end it.
    setsid bash -c 't0=$SECONDS; cd "$1" && FA_SKIP_INSTALL=1 CMAKE_PREFIX_PATH=/tmp/deps/usr timeout 1200 scripts/test.sh >"$2/test.log" 2>&1
                    echo "$? $((SECONDS - t0))" >"$2/done"' _ "$dir" "$NEWCOMER_TEST_DIR" </dev/null >/dev/null 2>&1 &
    record "newcomer_test_start: scripts/test.sh running in the background; bench/gpu_session.sh newcomer_wait collects it"
}

# ... and the second waits for it, then records it as newcomer_test does.
step_newcomer_wait() {
    note "newcomer_wait: scripts/test.sh in the fresh copy"
    local waited=0 rc secs
    [ -d "$NEWCOMER_TEST_DIR" ] || { record "newcomer_wait: nothing started: run newcomer_test_start first"; status=1; return 1; }
    while [ ! -f "$NEWCOMER_TEST_DIR/done" ] && [ "$waited" -lt "${WAIT_S:-540}" ]; do
        sleep 5
        waited=$((waited + 5))
    done
    cp "$NEWCOMER_TEST_DIR/test.log" "$LOGS/newcomer_test.log" 2>/dev/null
    if [ ! -f "$NEWCOMER_TEST_DIR/done" ]; then
        record "newcomer_wait: scripts/test.sh still running after $waited s more: call newcomer_wait again"
        tail -3 "$LOGS/newcomer_test.log" 2>/dev/null | tee -a "$LOGS/summary.txt"
        status=1
        return 1
    fi
    read -r rc secs <"$NEWCOMER_TEST_DIR/done"
    newcomer_test_report "$rc" "$secs"
}

step_test() {
    note "ctest (all tests)"
    ctest --test-dir "$BUILD" --output-on-failure -j8 --timeout "${TEST_TIMEOUT:-300}" >"$LOGS/ctest.log" 2>&1 || status=1
    tail -25 "$LOGS/ctest.log" | tee -a "$LOGS/summary.txt"
}

step_test11() {
    note "ctest: stage 11 and Hopper's wrappers"
    # A kernel that hangs (a barrier's phases out of step) fails its test after TEST11_TIMEOUT seconds.
    ctest --test-dir "$BUILD" --output-on-failure -R 'hopper|stage11' -j4 --timeout "${TEST11_TIMEOUT:-240}" \
        >"$LOGS/ctest11.log" 2>&1 || status=1
    grep -E "Test +#|tests passed|tests failed|Skipped|Failed" "$LOGS/ctest11.log" | tail -25 | tee -a "$LOGS/summary.txt"
}

# Stage 11's compiler traps (stages/11_hopper_kernel/traps/traps.cu): ptxas's messages and each
# kernel's SASS counts, with the expectation of each pair checked (bench/traps11.py):
# stage11_traps.json and stage11_traps_table.txt, the records docs/results/ keeps.
step_traps11() {
    note "traps11: stage 11's compiler traps, ptxas and SASS"
    python3 bench/traps11.py --check --json "$RESULTS/stage11_traps.json" --table "$RESULTS/stage11_traps_table.txt" \
        >"$LOGS/traps11.log" 2>&1 || { record "FAIL  traps11 (see traps11.log)"; status=1; }
    tee -a "$LOGS/summary.txt" <"$RESULTS/stage11_traps_table.txt" 2>/dev/null
    tail -1 "$LOGS/traps11.log" | tee -a "$LOGS/summary.txt"
}

# Small problems with tails, Nq != Nk, rows and whole query tiles that see no key.
sanitize_cases=(
    "--seq-q 77 --seq-k 93 --heads 2 --head-dim 32"
    "--seq-q 130 --seq-k 70 --heads 1 --head-dim 64 --causal --layout bnhd"
    "--seq-q 300 --seq-k 100 --batch 2 --head-dim 128 --causal"
    "--seq-q 65 --seq-k 129 --head-dim 128 --layout bnhd"
)
# Stage 07 adds d = 256 (Nq > Nk, causal: the first 23 rows see no key), fp16, and the first step
# of its road (plain shared loads, no pipeline), whose code paths the final kernel does not take.
sanitize_cases07=(
    "${sanitize_cases[@]}"
    "--seq-q 100 --seq-k 77 --heads 2 --head-dim 256 --causal"
    "--seq-q 77 --seq-k 93 --heads 2 --head-dim 64 --causal --dtype fp16"
    "--seq-q 130 --seq-k 70 --head-dim 128 --causal --layout bnhd --step 0"
)
# Stage 07's kernels with stage 10's switches, through test_stage07's cases (doctest filters): packed
# batches with sequences of length 0, 1 and primes, Nq != Nk, windows narrower than a tile and wider
# than N; grouped heads, windows, the soft cap and dropout on dense batches (dropout on packed ones too); d 32 to 256, bf16 and fp16.
sanitize_cases07m=(
    "-tc=*packed*batches*"
    "-tc=*grouped-query*"
    "-tc=*dropout*dense*packed*"
)
# Stage 09's default main kernel with stage 10's switches, through test_stage09's cases of them:
# grouped heads (dK, dV summed over the group), windows, the soft cap, and packed batches with
# sequences of length 0, 1 and primes, in both dQ modes; dropout on the small problems (the larger
# ones, a test case of their own, take more than 300 s under racecheck); the group split (S = 1, 2,
# G blocks per group).
sanitize_cases09m=(
    "-tc=*stage?10?s?switches?matches*"
    "-tc=*packed?batches?of*"
    "-tc=*stage?09?with?dropout*,*regenerates?stage?07?s?dropout?mask*"
    "-tc=*group?split*"
)
# Stage 09 (the backward, after stage 07's forward): tails (200 and 333 are not multiples of the
# 64-row blocks), Nq < Nk and Nq > Nk, both layouts, d 64 and 128, causal with Nq > Nk (the first
# 133 query rows see no key, and the key blocks past the last query see no query), dQ by atomics
# and in the deterministic order, fp16 once; each with every main kernel of the road (--step 0 to 3,
# or SANITIZE09_STEPS).
sanitize_cases09=(
    "--seq-q 200 --seq-k 333 --heads 2 --head-dim 64"
    "--seq-q 333 --seq-k 200 --head-dim 128 --causal --deterministic"
    "--seq-q 200 --seq-k 333 --batch 2 --head-dim 128 --layout bnhd"
    "--seq-q 333 --seq-k 200 --heads 2 --head-dim 64 --causal --layout bnhd"
    "--seq-q 200 --seq-k 333 --head-dim 64 --causal --deterministic --dtype fp16"
)
# Stage 05's road: every earlier step once, on a problem with tails, Nq > Nk and causal rows that
# see no key (the final step runs the cases above).
sanitize_cases05_road=(
    "--seq-q 130 --seq-k 77 --heads 2 --head-dim 64 --causal --step"
)
# Stage 11 (every step from 1: step 0 is stage 07's kernel, sanitized with stage 07): tails (200,
# 333, 77, 93 are not multiples of the 64- and 128-row tiles), Nq < Nk and Nq > Nk, causal with
# Nq > Nk (the first 133, resp. 53, query rows see no key), bnhd, fp16, d 64 and 128.
sanitize_cases11=(
    "--seq-q 200 --seq-k 333 --heads 2 --head-dim 64"
    "--seq-q 333 --seq-k 200 --head-dim 128 --causal"
    "--seq-q 130 --seq-k 77 --heads 2 --head-dim 64 --causal --layout bnhd"
    "--seq-q 200 --seq-k 333 --batch 2 --head-dim 128 --layout bnhd --dtype fp16"
    "--seq-q 77 --seq-k 93 --head-dim 64 --causal --dtype fp16"
    # more query tiles than SMs, and causal tiles that see no key (Nq > Nk): step 9's blocks loop over several
    "--seq-q 400 --seq-k 150 --batch 3 --heads 60 --head-dim 128 --causal --layout bnhd"
)

# The last step of stage 11's road, from the range its --help gives --step ("[0 - N]"); when the
# help does not say, the first step the executable refuses with exit 2 (a bad option), less one.
stage11_last_step() {
    local n s rc
    n=$("$STAGE11" --help 2>/dev/null | grep -- '--step' | grep -oE '\[0 - [0-9]+\]' | grep -oE '[0-9]+\]' | tr -d ']' | head -1)
    if [ -n "$n" ]; then echo "$n"; return 0; fi
    for s in $(seq 1 64); do
        "$STAGE11" --step "$s" --seq-q 64 --seq-k 64 --head-dim 64 --reference never >/dev/null 2>&1
        rc=$?
        if [ "$rc" -eq 2 ]; then echo $((s - 1)); return 0; fi
        if [ "$rc" -eq 77 ]; then echo 0; return 0; fi  # no Hopper GPU: nothing to sanitize
    done
    echo 64
}

step_sanitize() {
    note "compute-sanitizer"
    local exe tool args cases
    for stage in ${SANITIZE_STAGES:-05 06 07 09}; do
        case $stage in
            05) exe=$STAGE05 cases=("${sanitize_cases[@]}")
                local s
                for s in 0 1 2 3 4 5; do cases+=("${sanitize_cases05_road[0]} $s"); done ;;
            06) exe=$STAGE06 cases=("${sanitize_cases[@]}") ;;
            07) exe=$STAGE07 cases=("${sanitize_cases07[@]}") ;;
            07m) exe=$BUILD/tests/test_stage07 cases=("${sanitize_cases07m[@]}") ;;
            09m) exe=$BUILD/tests/test_stage09 cases=("${sanitize_cases09m[@]}")
                # shellcheck disable=SC2206  # a list of doctest filters without spaces
                [ -n "${SANITIZE09M_CASES:-}" ] && cases=($SANITIZE09M_CASES) ;;
            09) exe=$STAGE09 cases=()
                local c s9 steps09 last09
                last09=$(stage09_last_step)
                steps09=${SANITIZE09_STEPS:-$(seq 0 "${last09:-0}")}
                record "stage 09: road steps ${steps09//$'\n'/ } (of 0 to ${last09:-?}, from $(basename "$STAGE09") --help)"
                for c in "${sanitize_cases09[@]}"; do
                    for s9 in $steps09; do cases+=("$c --step $s9"); done
                done ;;
            11) exe=$STAGE11 cases=()
                local last c s
                last=$(stage11_last_step)
                record "stage 11: road steps 1 to $last (from $(basename "$STAGE11") --help)${SANITIZE11_STEPS:+; this call: steps $SANITIZE11_STEPS}"
                for s in ${SANITIZE11_STEPS:-$(seq 1 "$last")}; do
                    for c in "${sanitize_cases11[@]}"; do cases+=("$c --step $s"); done
                done ;;
            *) record "FAIL  sanitize: no stage $stage"; status=1; continue ;;
        esac
        for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}; do
            local log="$LOGS/sanitize_stage${stage}_${tool}.log"
            for args in "${cases[@]}"; do
                local one="$WORK/sanitize_one.log" rc
                # shellcheck disable=SC2046,SC2086  # $args is a list of options
                timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 $( [ "$tool" = memcheck ] && echo --leak-check full ) \
                    "$exe" $args $( case $stage in 07m|09m) ;; *) echo --reference never ;; esac ) >"$one" 2>&1
                rc=$?
                cat "$one" >>"$log"
                if [ "$rc" -eq 0 ]; then
                    record "ok    $tool $(basename "$exe") $args"
                elif [ "$rc" -eq 77 ]; then
                    record "skip  $tool $(basename "$exe") $args: $(grep -m1 -i 'skip\|needs' "$one")"
                else
                    record "FAIL  $tool $(basename "$exe") $args (exit $rc; see $(basename "$log"))"
                    # What the tool said (an instruction it does not support, an error it found), not only the verdict.
                    grep -m4 -iE "not supported|unsupported|cannot|ERROR|Invalid|Race|Barrier|Uninitialized" "$one" \
                        | sed 's/^/      /' | tee -a "$LOGS/summary.txt"
                    status=1
                fi
            done
            grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|LEAK SUMMARY" "$log" | sort | uniq -c | tee -a "$LOGS/summary.txt"
        done
    done
}

step_ceiling() {
    note "ceilings: mma.sync m16n8k16 bf16/fp16, ex2.approx, fp32 FMA; wgmma m64n256k16 bf16/fp16"
    "$BUILD/bench/mma_ceiling" --json "$RESULTS/mma_ceiling.jsonl" 2>&1 | tee "$RESULTS/mma_ceiling.txt" | tee -a "$LOGS/summary.txt" \
        || status=1
    # Stage 11's ceiling; exit 77 on a GPU without wgmma (recorded, not a failure).
    "$BUILD/bench/wgmma_ceiling" --json "$RESULTS/wgmma_ceiling.jsonl" >"$RESULTS/wgmma_ceiling.txt" 2>&1
    local rc=$?
    tee -a "$LOGS/summary.txt" <"$RESULTS/wgmma_ceiling.txt"
    [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || status=1
}

# What sdpa_compare.py needs to reuse this session's ceilings rather than measure them again.
ceiling_args() {
    if [ -s "$RESULTS/mma_ceiling.jsonl" ]; then echo --mma-ceiling-json "$RESULTS/mma_ceiling.jsonl"; fi
    if [ -s "$RESULTS/wgmma_ceiling.jsonl" ]; then echo --wgmma-ceiling-json "$RESULTS/wgmma_ceiling.jsonl"; fi
}

# Runs sdpa_compare.py with "$@", its log in $LOGS/$1.log, and copies its tables to the summary.
# $1: a name for the log; $2: the out dir; the rest: sdpa_compare.py's options.
compare() {
    local name=$1 dir=$2
    shift 2
    # shellcheck disable=SC2046
    PYTHONUNBUFFERED=1 python3 bench/sdpa_compare.py --bench-exe "$BUILD/bench/bench_gpu" --out-dir "$dir" $(ceiling_args) \
        --rounds "${ROUNDS:-3}" "$@" \
        >"$LOGS/$name.log" 2>&1 || { status=1; record "sdpa_compare.py $name FAILED:"; tail -20 "$LOGS/$name.log" | tee -a "$LOGS/summary.txt"; }
    # The points that failed their check and the kernels that were skipped, then the tables (after
    # the first empty line: bench_gpu and the SDPA progress print none).
    grep -E "BAD|MISMATCH|^ +skipped" "$LOGS/$name.log" | head -20 | tee -a "$LOGS/summary.txt"
    awk '/^$/ {table = 1} table' "$LOGS/$name.log" | tee -a "$LOGS/summary.txt"
}

step_road() {
    note "road: stage 07, every step and tuning candidate, bf16, beside SDPA flash and cuDNN"
    # shellcheck disable=SC2086  # ROAD_SIZES is a list
    compare road "$RESULTS/road" --stages 07 --dtypes bf16 --steps all --sizes ${ROAD_SIZES:-1024 4096 16384} \
        --head-dims 64 128 --repeat 20 --warmup 3
}

step_road11() {
    note "road11: stage 11, every step of its road, bf16, beside stage 07, SDPA flash and cuDNN"
    # shellcheck disable=SC2086  # ROAD11_SIZES is a list
    compare road11 "$RESULTS/road11" --stages 11 --dtypes ${ROAD11_DTYPES:-bf16} --steps11 ${ROAD11_STEPS:-all} \
        --sizes ${ROAD11_SIZES:-1024 4096 16384} \
        --head-dims 64 128 --repeat 20 --warmup 3
}

step_groups11() {
    note "groups11: stage 11's causal block order, step 5 and step 6 with L2 budgets per group of heads"
    local dir="$RESULTS/groups11" mib d
    mkdir -p "$dir"
    for mib in ${GROUP11_MIB:-4 16 64 1073741824}; do
        FA_STAGE11_GROUP_MIB=$mib "$BUILD/bench/bench_gpu" --stages 11 --steps11 5 6 --dtypes bf16 --sizes 1024 4096 16384 \
            --head-dims 64 128 --causal yes --repeat 20 --warmup 3 --check false \
            --json "$dir/sweep_$mib.json" --csv "$dir/sweep_$mib.csv" >>"$LOGS/groups11.log" 2>&1 || status=1
        for d in 64 128; do
            FA_STAGE11_GROUP_MIB=$mib "$BUILD/bench/bench_gpu" --stages 11 --steps11 5 6 --dtypes bf16 --sizes 4096 \
                --head-dims $d --causal yes --tokens 4096 --width $((16 * d)) --repeat 20 --warmup 3 --check false \
                --json "$dir/h16_${mib}_$d.json" --csv "$dir/h16_${mib}_$d.csv" >>"$LOGS/groups11.log" 2>&1 || status=1
        done
    done
    python3 - "$dir" >"$dir/groups11_table.txt" <<'PY' || status=1
import csv, glob, math, os, sys
rows, gains = [], {}
for path in glob.glob(os.path.join(sys.argv[1], "*.csv")):
    mib = int(os.path.basename(path).split("_")[1].split(".")[0])
    rows += [dict(r, mib=mib) for r in csv.DictReader(open(path)) if r["impl"].startswith("stage11")]
g = rows[0]
budgets = sorted({r["mib"] for r in rows})
name = lambda m: "all" if m >= 1 << 20 else f"{m} MiB"
print(f"{g['gpu']}, {g['date']}: stage 11 under a causal mask, bf16, TFLOP/s (median of 20): step 5 (head by head, timed")
print("beside each budget), step 6 (heaviest first across groups of heads whose K and V fit the budget)")
print(f"{'B':>3} {'H':>3} {'d':>4} {'N':>6}  {'step 5':>14}  " + "  ".join(f"{'6 @ ' + name(m):>12}" for m in budgets) + "   best/step 5")
for key in sorted({(int(r["B"]), int(r["H"]), int(r["d"]), int(r["N"])) for r in rows}, key=lambda k: (k[0] == 1, k[2], k[3])):
    sel = [r for r in rows if (int(r["B"]), int(r["H"]), int(r["d"]), int(r["N"])) == key]
    s5 = sorted(float(r["tflops"]) for r in sel if r["step"] == "5")
    s6 = {m: float(r["tflops"]) for r in sel if r["step"] == "6" for m in [r["mib"]]}
    best = max(s6.values())
    print(f"{key[0]:>3} {key[1]:>3} {key[2]:>4} {key[3]:>6}  {s5[len(s5) // 2]:6.1f} [{s5[0]:.0f}-{s5[-1]:.0f}]  "
          + "  ".join(f"{s6.get(m, float('nan')):12.1f}" for m in budgets) + f"   {best / s5[len(s5) // 2]:.2f}")
    for m in budgets:
        gains.setdefault(m, []).append(s6.get(m, 0.0) / s5[len(s5) // 2])
# The budget whose step 6 gains most over step 5 across the shapes (geometric mean).
mean = {m: math.exp(sum(math.log(max(g, 1e-9)) for g in gains[m]) / len(gains[m])) for m in budgets}
print("step 6 / step 5, geometric mean over the shapes: " + ", ".join(f"{name(m)} {mean[m]:.3f}" for m in budgets))
best = max(budgets, key=lambda m: mean[m])
print(f"best budget: {name(best)}")
open(os.path.join(sys.argv[1], "best_mib.txt"), "w").write(f"{best}\n")
PY
    tee -a "$LOGS/summary.txt" <"$dir/groups11_table.txt"
}

step_timeline11() {
    note "timeline11: stage 11's instrumented build, one block's marks, bf16, steps ${TIMELINE11_STEPS:-3 4 5 8 9 10}"
    local dir="$RESULTS/timeline11" shape d n causal step name flag
    mkdir -p "$dir"
    for shape in ${TIMELINE11_SHAPES:-128:4096:0 64:4096:0 128:1024:0 64:1024:1}; do
        IFS=: read -r d n causal <<<"$shape"
        flag=() && name="d${d}_n${n}"
        [ "$causal" = 1 ] && flag=(--causal) && name="${name}_causal"
        for step in ${TIMELINE11_STEPS:-3 4 5 8 9 10}; do
            "$STAGE11" --batch $((16384 / n)) --heads $((2048 / d)) --seq-q "$n" --seq-k "$n" --head-dim "$d" "${flag[@]}" \
                --step "$step" --bench --repeat 20 --warmup 3 --reference never \
                --timeline "$dir/stage11_timeline_${name}_step$step.json" >>"$LOGS/timeline11.log" 2>&1 || status=1
        done
        python3 docs/make_timeline.py --out "$dir/timeline_$name.svg" --table "$dir/timeline_table_$name.txt" \
            "$dir"/stage11_timeline_"${name}"_step*.json >>"$LOGS/timeline11.log" 2>&1 || status=1
        tee -a "$LOGS/summary.txt" <"$dir/timeline_table_$name.txt"
    done
    grep -E "^timeline:|FAIL|error" "$LOGS/timeline11.log" | tee -a "$LOGS/summary.txt"
}

step_road05() {
    note "road05: stage 05, every step of its road, float32, d 64/128, N ${ROAD05_SIZES:-1024 4096}, non-causal"
    mkdir -p "$RESULTS/road05"
    # shellcheck disable=SC2086  # ROAD05_SIZES is a list
    "$BUILD/bench/bench_gpu" --stages 05 --road05 --sizes ${ROAD05_SIZES:-1024 4096} --head-dims 64 128 --causal no \
        --repeat 10 --warmup 2 --json "$RESULTS/road05/road05.json" --csv "$RESULTS/road05/road05.csv" \
        >"$LOGS/road05.log" 2>&1 || status=1
    grep -E "BAD|MISMATCH|skipped" "$LOGS/road05.log" | head -20 | tee -a "$LOGS/summary.txt"
    python3 - "$RESULTS/road05/road05.csv" >"$RESULTS/road05/road05_table.txt" <<'PY' || status=1
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["impl"].startswith("stage05")]
g = rows[0]
print(f"{g['gpu']}, {g['date']}: stage 05's road, float32, non-causal, B*N = 16384, H*d = 2048, TFLOP/s (median)")
print(f"{'step':>4}  {'name':<22} {'d':>4} {'N':>6} {'ms':>9} {'TFLOP/s':>8} {'gain':>6}  check")
for d in sorted({int(r["d"]) for r in rows}):
    for n in sorted({int(r["N"]) for r in rows}):
        prev = None
        for r in sorted((r for r in rows if int(r["d"]) == d and int(r["N"]) == n), key=lambda r: int(r["step"])):
            tf = float(r["tflops"])
            gain = f"{tf / prev:5.2f}x" if prev else "     -"
            print(f"{r['step']:>4}  {r['step_name']:<22} {d:>4} {n:>6} {float(r['median_ms']):9.3f} {tf:8.2f} {gain}  {r['check'] or '-'}")
            prev = tf
PY
    tee -a "$LOGS/summary.txt" <"$RESULTS/road05/road05_table.txt"
}

# The packed batch of stage 10's benchmarks: lengths drawn from 128 to 8192 (seed 7) until 16384
# tokens, the last one cut to fit; comma-separated.
packed_lengths() {
    python3 -c 'import random
r = random.Random(7); out = []; left = 16384
while left > 0:
    n = min(left, r.randint(128, 8192)); out.append(n); left -= n
print(",".join(map(str, out)))'
}

step_switches07() {
    note "switches07: stage 07 with stage 10's switches beside its plain causal kernel; a packed batch of mixed lengths"
    local lengths
    lengths=$(packed_lengths)
    record "packed lengths: $lengths"
    "$BUILD/bench/bench_gpu" --stages 07 --dtypes bf16 fp16 --sizes 4096 16384 --head-dims 64 128 --causal yes \
        --model07 8/-1/0 4/-1/0 1/4095/0 1/-1/0/50 1/-1/0/0/0.1 --varlen07 "$lengths" --repeat 20 --warmup 3 --check false --json "$RESULTS/switches07.json" --csv "$RESULTS/switches07.csv" \
        >"$RESULTS/switches07.txt" 2>&1 || { record "FAIL  switches07 (see switches07.txt)"; status=1; }
    grep -E "^stage10 " "$RESULTS/switches07.txt" | tee -a "$LOGS/summary.txt"
}

step_stage10() {
    note "stage10: stage 10's switches, forward and backward, beside PyTorch SDPA; a packed batch of mixed lengths"
    local lengths
    lengths=$(packed_lengths)
    record "packed lengths: $lengths"
    local varlen=(--varlen07 "$lengths")
    [ "${STAGE10_VARLEN:-1}" = 0 ] && varlen=()
    # shellcheck disable=SC2086  # STAGE10_MODELS and STAGE10_DTYPES are lists
    compare stage10 "$RESULTS/stage10" --stages 10 --dtypes ${STAGE10_DTYPES:-bf16 fp16} --sizes 4096 16384 --head-dims 64 128 \
        --causal yes --model07 ${STAGE10_MODELS:-8/-1/0 4/-1/0 1/4095/0 1/-1/0/0/0.1} "${varlen[@]}" \
        --repeat "${STAGE10_REPEAT:-10}" --warmup 3 --check false
}

# ROUNDS rounds of bench_gpu with each block order of a stage, interleaved, into $RESULTS/NAME.txt,
# and the lines matching PATTERN into the summary. $1: NAME (the step's), $2: the environment
# variable that picks the order, $3: its values (a list, the default first), $4: PATTERN; the rest:
# bench_gpu's arguments.
block_orders() {
    local name=$1 variable=$2 orders=$3 pattern=$4 r order out="$RESULTS/$1.txt"
    shift 4
    : >"$out"
    for r in $(seq 1 "${ROUNDS:-3}"); do
        for order in $orders; do
            echo "== round $r, block order $order" >>"$out"
            env "$variable=$order" "$BUILD/bench/bench_gpu" "$@" >>"$out" 2>&1 \
                || { record "FAIL  $name (see $name.txt)"; status=1; }
        done
    done
    grep -E "$pattern" "$out" | tee -a "$LOGS/summary.txt"
}

# Stage 07's packed forward on stage 10's batch of mixed lengths, its blocks in two orders: entry
# by entry of the schedule with the heads innermost (the default when the lengths differ) and head
# by head (FA_STAGE07_BLOCK_ORDER=heads), ROUNDS rounds of both, interleaved: order07.txt.
step_order07() {
    note "order07: stage 07's packed blocks, entry by entry with the heads innermost against head by head"
    local lengths
    lengths=$(packed_lengths)
    record "packed lengths: $lengths"
    block_orders order07 FA_STAGE07_BLOCK_ORDER "entries heads" "^== |^stage07 varlen" --stages 07 --dtypes bf16 fp16 \
        --sizes 4096 --head-dims 64 128 --causal yes --varlen07 "$lengths" --repeat 20 --warmup 3 --check false
}

# Stage 09's backward with grouped heads under a causal mask, its blocks in two orders: key block
# by key block across the heads (the default: the longest loops first) and head by head
# (FA_STAGE09_BLOCK_ORDER=heads), ROUNDS rounds of both, interleaved: order09.txt.
step_order09() {
    note "order09: stage 09's grouped-head blocks, longest loops first against head by head"
    block_orders order09 FA_STAGE09_BLOCK_ORDER "key-blocks heads" "^== |^stage10 " --stages 07 09 --dtypes bf16 \
        --sizes 4096 16384 --head-dims 64 128 --causal yes --model07 8/-1/0 4/-1/0 --repeat 10 --warmup 3 --check false
}

# Stage 09's backward with grouped heads under a causal mask, each group of query heads split over
# S blocks (FA_STAGE09_GROUP_SPLIT=S; 0: the rule of launch.cuh's group_split_rule()), for each S
# that divides the group (8:1 takes 1, 2, 4, 8; 4:1 takes 1, 2, 4; the stage refuses the others),
# ROUNDS rounds, interleaved: split09.txt.
step_split09() {
    note "split09: stage 09's grouped-head backward with each group split over S blocks"
    local r group split out="$RESULTS/split09.txt"
    : >"$out"
    for r in $(seq 1 "${ROUNDS:-3}"); do
        for group in 8 4; do
            for split in 1 2 4 8 0; do
                if [ "$split" -gt 0 ] && [ $((group % split)) -ne 0 ]; then continue; fi
                echo "== round $r, group $group:1, group split $split" >>"$out"
                FA_STAGE09_GROUP_SPLIT=$split "$BUILD/bench/bench_gpu" --stages 07 09 --dtypes bf16 --sizes 4096 16384 \
                    --head-dims 64 128 --causal yes --model07 "$group/-1/0" --repeat 10 --warmup 3 --check false \
                    >>"$out" 2>&1 || { record "FAIL  split09 (see split09.txt)"; status=1; }
            done
        done
    done
    grep -E "^== |^stage10 " "$out" | tee -a "$LOGS/summary.txt"
}

# The last step of stage 09's road, from the range its --help gives --step ("[0 - N]"); empty when
# the help does not say.
stage09_last_step() {
    "$STAGE09" --help 2>/dev/null | sed -n 's/.*--step INT:INT in \[0 - \([0-9][0-9]*\)\].*/\1/p' | head -1
}

# The default main kernel's step, as stage09_backward_kernel --help names it:
# "--step INT:INT in [0 - 10]  which step of the road runs (default: step 9):"
stage09_default_step() {
    "$STAGE09" --help 2>/dev/null | sed -n 's/.*--step .*(default: step \([0-9][0-9]*\)).*/\1/p' | head -1
}

# Every step of stage 09's road in one run: the default main kernel (rows stage09) with every other
# step beside it (--steps09, the steps read from stage09_backward_kernel --help), bf16, d 64/128,
# N 4096/16384, causal and not, ROUNDS rounds of ROAD09_REPEAT timed runs (default 10): one record
# for the lesson's road table (road09/stage09_sweep_table.txt and ratios_over_rounds.txt). The other
# steps time their backward with atomic dQ alone (--steps09-backward-only: the road table's
# figure; the guard still checks each), not the pair and the deterministic backward as well: three
# rows a step made one round about 300 s on an H200 (2026-11-26), and three rounds did not fit in a
# 600 s call; with the flag three rounds took 396 s: run the build step in an earlier call and leave
# road09 a call of its own. road09/stage09_road09.txt is the record docs/results/ keeps.
step_road09() {
    local steps=() default last s
    default=$(stage09_default_step)
    last=$(stage09_last_step)
    for s in $(seq 0 "${last:--1}"); do [ "$s" = "$default" ] || steps+=("$s"); done
    note "road09: stage 09's road in one run, default step ${default:-?} beside steps ${steps[*]:-?}, bf16"
    if [ -z "$default" ] || [ ${#steps[@]} -eq 0 ]; then
        record "FAIL  road09: could not read the road's steps from $STAGE09 --help"
        status=1
        return 0
    fi
    compare road09 "$RESULTS/road09" --stages 07 09 --dtypes bf16 --sizes 4096 16384 --repeat "${ROAD09_REPEAT:-10}" \
        --warmup 2 --steps09 "${steps[@]}" --steps09-backward-only
    [ -f "$RESULTS/road09/stage09_sweep_table.txt" ] || return 0
    {
        echo "bench/gpu_session.sh road09 (${ROUNDS:-3} rounds, each ours then SDPA); B*N = 16384, H*d = 2048."
        echo "In this run the default main kernel (rows stage09) was step $default; the step tables give every other" \
            "step beside it (/09), each timed by its backward with atomic dQ alone."
        cat "$RESULTS/road09/stage09_sweep_table.txt"
    } >"$RESULTS/road09/stage09_road09.txt"
    record "road09: the record is road09/stage09_road09.txt (docs/results/stage09_road09.txt)"
}

step_timing() {
    note "timing: SDPA flash's forward timed four ways (the course's events, do_bench, an idle GPU, a CUDA graph)"
    python3 bench/timing_check.py --rounds "${ROUNDS:-3}" --out "$RESULTS/timing_check.txt" >"$LOGS/timing_check.log" 2>&1 \
        || { record "FAIL  timing (see timing_check.log)"; status=1; }
    tail -n +1 "$RESULTS/timing_check.txt" 2>/dev/null | tee -a "$LOGS/summary.txt"
}

step_sweep07() {
    note "sweep07: stage 07 (bf16, fp16) beside SDPA flash and cuDNN, the full grid"
    local merge=()
    [ -f docs/results/gpu_sweep.csv ] && merge=(--merge-with docs/results/gpu_sweep.csv)
    compare sweep07 "$RESULTS/sweep07" --stages 07 --dtypes bf16 fp16 "${merge[@]}"
}

step_sweep09() {
    note "sweep09: stage 07 forward + stage 09 backward (bf16, fp16) beside SDPA flash and cuDNN, the full grid"
    local merge=()
    [ -f docs/results/gpu_sweep.csv ] && merge=(--merge-with docs/results/gpu_sweep.csv)
    # shellcheck disable=SC2086  # SWEEP09_STAGES is a list
    compare sweep09 "$RESULTS/sweep09" --stages ${SWEEP09_STAGES:-07 09} --dtypes bf16 fp16 --steps09 ${STEPS09:-1} "${merge[@]}"
}

step_quick() {
    note "quick benchmark"
    # shellcheck disable=SC2086  # QUICK_SIZES is a list
    compare quick "$RESULTS/quick" --stages ${QUICK_STAGES:-05 06 07} --sizes ${QUICK_SIZES:-2048 8192} --repeat 10 --warmup 2 \
        --steps09 ${STEPS09:-1}
}

step_sweep() {
    note "sweep: stages 05, 06, 07 beside PyTorch SDPA"
    compare sweep "$RESULTS" --stages 05 06 07
}

# The metrics of "$@" this ncu knows on this GPU (by base name), comma-separated; the unknown
# ones are named on stderr. All of them when ncu cannot list its metrics.
known_metrics() {
    [ -f "$WORK/ncu_metrics.txt" ] || ncu --query-metrics 2>/dev/null | awk 'NF {print $1}' >"$WORK/ncu_metrics.txt"
    local m out=()
    for m in "$@"; do
        if [ ! -s "$WORK/ncu_metrics.txt" ] || grep -qx "${m%%.*}" "$WORK/ncu_metrics.txt"; then
            out+=("$m")
        else
            echo "ncu here does not know ${m%%.*}: left out" >&2
        fi
    done
    (IFS=,; echo "${out[*]}")
}

# "--section X" for each section of "$@" this ncu has (by identifier); all of them when ncu cannot
# list its sections.
known_sections() {
    [ -f "$WORK/ncu_sections.txt" ] || ncu --list-sections 2>/dev/null | awk 'NF {print $1}' >"$WORK/ncu_sections.txt"
    local s
    for s in "$@"; do
        if [ ! -s "$WORK/ncu_sections.txt" ] || grep -qx "$s" "$WORK/ncu_sections.txt"; then
            echo --section "$s"
        else
            echo "ncu here has no section $s: left out" >&2
        fi
    done
}

# Text of an Nsight Compute report, with every section's details when this ncu can print them.
ncu_text() {
    ncu --import "$1" --page details --print-details all 2>/dev/null || ncu --import "$1" --page details
}

# Drops bench_gpu's own lines from a profiled run's output (its timings under replays mean nothing).
strip_bench() { grep -v -E '^\[ *[0-9]+/ *[0-9]+\]|^(gpu|method|wrote|stage 0[79]|stage 11|skipped) |^ +(vs|skipped|stage 0|stage09_step[0-9]+:|forward \+ backward|guard:)'; }

step_ncu() {
    note "ncu: stage 05 kernel, B=4 N=4096, d=64 (H=32) and d=128 (H=16), one launch each"
    local args=(--stages 05 --sizes 4096 --head-dims 64 128 --causal no --repeat 1 --warmup 0 --check false
                --schedule-ablation false --json /tmp/ncu.json --csv /tmp/ncu.csv)
    ncu --clock-control none -k regex:attention_kernel --launch-count 2 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
        --section ComputeWorkloadAnalysis --section WarpStateStats \
        "$BUILD/bench/bench_gpu" "${args[@]}" >"$RESULTS/ncu_stage05.txt" 2>&1 || status=1
    grep -E "attention_kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Dynamic Shared|Block Limit" \
        "$RESULTS/ncu_stage05.txt" | tee -a "$LOGS/summary.txt"
    # Counters for the roofline and the shared-memory banks (a separate run: a metric this ncu does
    # not know must not cost the report above).
    ncu --clock-control none -k regex:attention_kernel --launch-count 2 \
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,smsp__sass_thread_inst_executed_op_ffma_pred_on.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,smsp__inst_executed.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum \
        "$BUILD/bench/bench_gpu" "${args[@]}" >"$RESULTS/ncu_stage05_metrics.txt" 2>&1 || true
    grep -E "attention_kernel|dram__|lts__|ffma|bank_conflicts|wavefronts|inst_executed.sum|local" "$RESULTS/ncu_stage05_metrics.txt" | tee -a "$LOGS/summary.txt"
    # One file for docs/results/: the commands, then both reports without bench_gpu's own lines.
    {
        echo "Nsight Compute on the stage 05 kernel, $(nvidia-smi --query-gpu=name --format=csv,noheader), $(date -u +%F)."
        echo "Commands (bench/gpu_session.sh, step ncu):"
        echo "  ncu --clock-control none -k regex:attention_kernel --launch-count 2 --section SpeedOfLight --section Occupancy"
        echo "      --section LaunchStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats"
        echo "      bench_gpu ${args[*]}"
        echo "  ncu ... --metrics dram__bytes_read.sum,... (second report below)"
        echo
        strip_bench <"$RESULTS/ncu_stage05.txt"
        echo
        echo "---- counters (second ncu run, --metrics) ----"
        strip_bench <"$RESULTS/ncu_stage05_metrics.txt"
    } >"$RESULTS/ncu_stage05_report.txt"
}

# Counters of the stage 07 reports: tensor-pipe use, shared-memory traffic and bank conflicts,
# ldmatrix and cp.async instructions, spills, the special-function pipe (ex2), the stall reasons.
NCU07_METRICS=(
    gpu__time_duration.sum
    sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
    sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active
    l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
    l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum
    l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum
    l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum
    l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum
    smsp__inst_executed_op_ldsm.sum
    smsp__sass_inst_executed_op_ldsm.sum
    smsp__sass_inst_executed_op_shared_ld.sum
    smsp__sass_inst_executed_op_shared_st.sum
    smsp__sass_inst_executed_op_ldgsts.sum
    smsp__inst_executed.sum
    launch__registers_per_thread
    launch__occupancy_limit_registers
    sm__warps_active.avg.pct_of_peak_sustained_active
    l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum
    l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum
    dram__bytes_read.sum
    smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio
    smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
    smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio
    smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio
    smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio
    smsp__average_warps_issue_stalled_wait_per_issue_active.ratio
    smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio
    smsp__average_warps_issue_stalled_selected_per_issue_active.ratio
    smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio
    smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio
    smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio
    smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio
    smsp__inst_executed_op_global_red.sum
    l1tex__t_requests_pipe_lsu_mem_global_op_red.sum
    l1tex__t_sectors_pipe_lsu_mem_global_op_red.sum
    lts__t_sectors_srcunit_tex_op_red.sum
)

# The counters the lesson quotes for the road's ldmatrix and swizzle steps.
NCUROAD_METRICS=(
    gpu__time_duration.sum
    sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
    l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
    l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum
    l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum
    l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum
    l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum
    smsp__inst_executed_op_ldsm.sum
    smsp__sass_inst_executed_op_ldsm.sum
    smsp__sass_inst_executed_op_shared_ld.sum
    smsp__sass_inst_executed_op_ldgsts.sum
)

# One launch of a kernel under Nsight Compute: the sections (report $2.txt) and the counters
# ($2_metrics.txt). $1: the kernel's name (a regex); $2: the report's name; the rest: the command
# that launches it (bench_gpu, or PyTorch for SDPA's kernels).
ncu_command() {
    local kernel=$1 name=$2
    local -n ncu_set=${NCU_METRICS:-NCU07_METRICS}  # which counters: NCU_METRICS names the array
    shift 2
    mkdir -p "$WORK/ncu-rep"
    # The first launch of the kernel is profiled (Nsight Compute flushes the caches before it, as the
    # timing does); the command's own timed launches after it run unprofiled.
    local sections
    mapfile -t sections < <(known_sections SpeedOfLight Occupancy LaunchStats MemoryWorkloadAnalysis MemoryWorkloadAnalysis_Tables \
                            ComputeWorkloadAnalysis WarpStateStats 2>>"$LOGS/$name.log" | tr ' ' '\n')
    # NCU_NAME_BASE=demangled lets the regex name template arguments (one instance of a kernel).
    timeout 300 ncu --clock-control none --kernel-name-base "${NCU_NAME_BASE:-function}" -k "regex:$kernel" --launch-count 1 \
        --force-overwrite -o "$WORK/ncu-rep/$name" \
        "${sections[@]}" "$@" >>"$LOGS/$name.log" 2>&1 || { status=1; tail -5 "$LOGS/$name.log"; }
    ncu_text "$WORK/ncu-rep/$name.ncu-rep" >"$RESULTS/$name.txt" 2>&1
    timeout 300 ncu --clock-control none --kernel-name-base "${NCU_NAME_BASE:-function}" -k "regex:$kernel" --launch-count 1 \
        --metrics "$(known_metrics "${ncu_set[@]}" 2>>"$LOGS/$name.log")" \
        "$@" 2>&1 | strip_bench >"$RESULTS/${name}_metrics.txt" || status=1
}

# ncu_command() on bench_gpu. $1: the kernel's name; $2: the report's name; the rest: bench_gpu's
# options (one stage, one shape, one step, one dtype).
ncu_one() {
    local kernel=$1 name=$2
    shift 2
    ncu_command "$kernel" "$name" "$BUILD/bench/bench_gpu" --repeat 1 --warmup 0 --check false --json /tmp/ncu.json \
        --csv /tmp/ncu.csv "$@"
}

# One stage 07 launch under Nsight Compute. $1: the report's name; the rest: bench_gpu's options.
ncu07_one() {
    local name=$1
    shift
    ncu_one "$KERNEL07" "$name" --stages 07 "$@"
}

step_ncu07() {
    note "ncu07: stage 07 final kernel, bf16, N=4096 non-causal, d=64 (B=4 H=32) and d=128 (B=4 H=16), one launch each"
    local d
    for d in 64 128; do
        ncu07_one "ncu_stage07_d$d" --dtypes bf16 --sizes 4096 --head-dims "$d" --causal no
        record "-- d=$d"
        grep -E "$KERNEL07|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Dynamic Shared|Block Limit|Bank Conflicts" \
            "$RESULTS/ncu_stage07_d$d.txt" | head -20 | tee -a "$LOGS/summary.txt"
        grep -E "hmma|pipe_xu|bank_conflicts|wavefronts|ldsm|ldgsts|local_op|registers|stalled_(barrier|long|short|mio|math|wait)" \
            "$RESULTS/ncu_stage07_d${d}_metrics.txt" | tee -a "$LOGS/summary.txt"
    done
}

# Stage 11's counters: the tensor pipe as wgmma drives it (and as mma.sync would, to see that none
# of it is left), the special-function pipe (exp2), registers and occupancy, shared-memory traffic,
# the stall reasons (a warp waiting on an mbarrier or a wgmma shows as long scoreboard or wait).
NCU11_METRICS=(
    gpu__time_duration.sum
    sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active
    sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
    sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active
    sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active
    sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active
    smsp__issue_active.avg.pct_of_peak_sustained_active
    l1tex__t_requests_pipe_lsu_mem_global_op_st.sum
    l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum
    launch__registers_per_thread
    launch__occupancy_limit_registers
    launch__occupancy_limit_shared_mem
    sm__warps_active.avg.pct_of_peak_sustained_active
    l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum
    l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum
    dram__bytes_read.sum
    smsp__inst_executed.sum
    smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio
    smsp__average_warps_issue_stalled_membar_per_issue_active.ratio
    smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
    smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio
    smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio
    smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio
    smsp__average_warps_issue_stalled_wait_per_issue_active.ratio
    smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio
    smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio
    smsp__average_warps_issue_stalled_selected_per_issue_active.ratio
    smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio
    smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio
    smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio
)

step_ncu11() {
    note "ncu11: stage 11's default kernel, bf16, N=4096 non-causal, d=64 (B=4 H=32) and d=128 (B=4 H=16), one launch each"
    local d
    for d in 64 128; do
        # The first launch of the kernel is bench_gpu's untimed run of the final step.
        NCU_METRICS=NCU11_METRICS ncu_one "$KERNEL11" "ncu_stage11_d$d" --stages 11 --dtypes bf16 --sizes 4096 --head-dims "$d" \
            --causal no
        record "-- d=$d"
        grep -E "$KERNEL11|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Dynamic Shared|Block Limit" \
            "$RESULTS/ncu_stage11_d$d.txt" | head -20 | tee -a "$LOGS/summary.txt"
        grep -E "gmma|hmma|pipe_xu|registers|occupancy_limit|local_op|stalled_(barrier|membar|long|short|mio|math|wait|sleeping)" \
            "$RESULTS/ncu_stage11_d${d}_metrics.txt" | tee -a "$LOGS/summary.txt"
        grep -h "does not know" "$LOGS/ncu_stage11_d$d.log" 2>/dev/null | sort -u | tee -a "$LOGS/summary.txt"
    done
}

# Every step of stage 11's road under Nsight Compute's counters (NCU11_METRICS), one bench_gpu run
# per head dimension with every launch of the kernel profiled; bench/ncu_steps11.py keeps the first
# launch of each step and tabulates them: ncu_stage11_road.txt.
step_ncu11road() {
    local steps=${NCU11_STEPS:-all} n=${NCU11_SIZE:-4096} causal=${NCU11_CAUSAL:-no} d reports=()
    local mask=non-causal
    [ "$causal" = yes ] && mask=causal
    note "ncu11road: stage 11, steps $steps, bf16, N=$n $mask, d ${NCU11_DIMS:-64 128} (B*N = 16384, H*d = 2048), counters of each step"
    for d in ${NCU11_DIMS:-64 128}; do
        # shellcheck disable=SC2086  # NCU11_STEPS is a list
        timeout 500 ncu --clock-control none -k "regex:$KERNEL11" --metrics "$(known_metrics "${NCU11_METRICS[@]}" 2>>"$LOGS/ncu11road.log")" \
            "$BUILD/bench/bench_gpu" --stages 11 --steps11 $steps --dtypes bf16 --sizes "$n" --head-dims "$d" --causal "$causal" --repeat 1 \
            --warmup 0 --check false --json /tmp/ncu.json --csv /tmp/ncu.csv >"$RESULTS/ncu_stage11_road_d${d}_metrics.txt" 2>&1 || status=1
        reports+=("$RESULTS/ncu_stage11_road_d${d}_metrics.txt")
    done
    {
        echo "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u +%F): stage 11's road in Nsight Compute counters (gpu_session.sh ncu11road), bf16, $mask, B $((16384 / n)), N $n, H d = 2048, the first launch of each step"
        python3 bench/ncu_steps11.py "${reports[@]}"
    } >"$RESULTS/ncu_stage11_road.txt" 2>&1 || status=1
    tee -a "$LOGS/summary.txt" <"$RESULTS/ncu_stage11_road.txt"
}

step_ncu09() {
    note "ncu09: stage 09 $KERNEL09 (step 0) and $KERNEL09_TILED (steps 1-3; atomic dQ), bf16, N=4096 non-causal, d=64 (B=4 H=32) and d=128 (B=4 H=16), one launch each"
    local d
    for d in 64 128; do
        # Step 0's kernel (flash_backward_kernel) runs only as --steps09 0, whose first launch is the
        # deterministic one: the regex names the atomic instance ($ATOMIC09).
        NCU_NAME_BASE=demangled ncu_one "$KERNEL09<.*$ATOMIC09" "ncu_stage09_d$d" --stages 09 --steps09 0 --dtypes bf16 --sizes 4096 \
            --head-dims "$d" --causal no
        record "-- d=$d"
        grep -E "$KERNEL09|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Dynamic Shared|Block Limit|Bank Conflicts" \
            "$RESULTS/ncu_stage09_d$d.txt" | head -20 | tee -a "$LOGS/summary.txt"
        grep -E "hmma|pipe_xu|bank_conflicts|wavefronts|ldsm|ldgsts|local_op|registers|stalled_(barrier|long|short|mio|math|wait)" \
            "$RESULTS/ncu_stage09_d${d}_metrics.txt" | tee -a "$LOGS/summary.txt"
        # How the backward's time splits between its three kernels: the first launch of each.
        # (the default main kernel is the warp-tiled one, stage09_backward_kernel --help names its step)
        timeout 300 ncu --clock-control none -k "regex:backward_preprocess_kernel|$KERNEL09_TILED|backward_postprocess_kernel" \
            --launch-count 3 --metrics gpu__time_duration.sum \
            "$BUILD/bench/bench_gpu" --stages 09 --dtypes bf16 --sizes 4096 --head-dims "$d" --causal no --repeat 1 --warmup 0 \
            --check false --json /tmp/ncu.json --csv /tmp/ncu.csv 2>&1 | strip_bench >"$RESULTS/ncu_stage09_split_d$d.txt" || status=1
        grep -E "^ +void .*_kernel<|gpu__time_duration" "$RESULTS/ncu_stage09_split_d$d.txt" | tee -a "$LOGS/summary.txt"
        # The warp-tiled kernel of step 1 (at d = 64 the default step 2 runs the same instance; at
        # d = 128 step 1's instance is the one with 128 x 64 blocks, picked by its template arguments
        # as Nsight Compute writes them demangled: "TiledFeatures<(int)128, (int)64, ...").
        if [ "$d" = 128 ]; then
            NCU_NAME_BASE=demangled ncu_one "$KERNEL09_TILED<[^<]*TiledFeatures<\\(int\\)128, \\(int\\)64,.*$ATOMIC09" "ncu_stage09_tiled_d$d" --stages 09 \
                --steps09 1 --dtypes bf16 --sizes 4096 --head-dims "$d" --causal no
        else
            ncu_one "$KERNEL09_TILED" "ncu_stage09_tiled_d$d" --stages 09 --steps09 1 --dtypes bf16 --sizes 4096 --head-dims "$d" \
                --causal no
        fi
        record "-- step 1 (warp-tiled), d=$d"
        grep -E "$KERNEL09_TILED|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Dynamic Shared|Bank Conflicts" \
            "$RESULTS/ncu_stage09_tiled_d$d.txt" | head -20 | tee -a "$LOGS/summary.txt"
        grep -E "hmma|pipe_xu|bank_conflicts|wavefronts|ldsm|registers|stalled_(barrier|long|short|mio|math|wait)" \
            "$RESULTS/ncu_stage09_tiled_d${d}_metrics.txt" | tee -a "$LOGS/summary.txt"
    done
    # Steps 2 and 3 (NCU09_STEPS) differ from step 1 only at d = 128: their 64 x 128 blocks there.
    local s
    local -A instance=([2]="[^<]*TiledFeatures<\\(int\\)64, \\(int\\)128," [3]=".*WithDpPieces<")
    for s in ${NCU09_STEPS:-2 3}; do
        NCU_NAME_BASE=demangled ncu_one "$KERNEL09_TILED<${instance[$s]}.*$ATOMIC09" "ncu_stage09_step${s}_d128" --stages 09 \
            --steps09 "$s" --dtypes bf16 --sizes 4096 --head-dims 128 --causal no
        record "-- step $s, d=128"
        grep -E "$KERNEL09_TILED|Duration|Achieved Occupancy|Registers Per|Dynamic Shared|Bank Conflicts" \
            "$RESULTS/ncu_stage09_step${s}_d128.txt" | head -20 | tee -a "$LOGS/summary.txt"
        grep -E "hmma|pipe_xu|bank_conflicts|wavefronts|ldsm|local_op|registers|stalled_(barrier|long|short|mio|math|wait)" \
            "$RESULTS/ncu_stage09_step${s}_d128_metrics.txt" | tee -a "$LOGS/summary.txt"
    done
}

# The regex of the warp-tiled kernel instance of stage 09's step $1 at head dimension $2, as Nsight
# Compute demangles it (NCU_NAME_BASE=demangled: "flash_backward_tiled_kernel<__nv_bfloat16, (int)64,
# fa::stage09::WithPtInRegisters<fa::stage09::TiledFeatures<(int)128, ..."), atomic dQ.
instance09() {
    local step=$1 d=$2 shape
    case "$step:$d" in
        1:128) shape="[^<]*TiledFeatures<\\(int\\)128, \\(int\\)64," ;;
        2:128 | 4:128 | 5:128) shape="[^<]*TiledFeatures<\\(int\\)64, \\(int\\)128," ;;
        3:128) shape=".*WithDpPieces<" ;;
        1:* | 2:* | 3:*) shape="[^<]*TiledFeatures<" ;;
        4:*) shape="[^<]*WithPtInRegisters<[^<]*TiledFeatures<[^>]*, \\(int\\)32, \\(int\\)1>" ;;
        5:*) shape="[^<]*WithPtInRegisters<[^<]*TiledFeatures<[^>]*, \\(int\\)16, \\(int\\)1>" ;;
        6:*) shape="[^<]*WithFreshLanes<" ;;
        7:*) shape="[^<]*WithDqAdds<.*>, \\(int\\)1>" ;;
        8:*) shape="[^<]*WithDqAdds<.*>, \\(int\\)4>" ;;
        9:*) shape="[^<]*WithDqTiles<[^<]*(WithPtInRegisters|TiledFeatures)<" ;;
        10:*) shape="[^<]*WithDqTiles<[^<]*WithDqAdds<" ;;
    esac
    echo "$KERNEL09_TILED<[^,]*, \\(int\\)$d, $shape.*$ATOMIC09"
}

step_ncu09at() {
    note "ncu09at: stage 09's warp-tiled kernel at NCU09_AT (step:d ...), bf16, N=4096 non-causal, atomic dQ, one launch each"
    local at s d
    for at in ${NCU09_AT:-2:64 4:64 5:64}; do
        s=${at%%:*} d=${at##*:}
        NCU_NAME_BASE=demangled ncu_one "$(instance09 "$s" "$d")" "ncu_stage09_step${s}_d$d" --stages 09 --steps09 "$s" \
            --dtypes bf16 --sizes 4096 --head-dims "$d" --causal no
        record "-- step $s, d=$d"
        grep -E "$KERNEL09_TILED|Duration|Achieved Occupancy|Registers Per|Dynamic Shared|Bank Conflicts" \
            "$RESULTS/ncu_stage09_step${s}_d$d.txt" | head -20 | tee -a "$LOGS/summary.txt"
        grep -E "hmma|pipe_xu|bank_conflicts|wavefronts|ldsm|local_op|registers|stalled_(barrier|long|short|mio|math|wait|lg)|_red" \
            "$RESULTS/ncu_stage09_step${s}_d${d}_metrics.txt" | tee -a "$LOGS/summary.txt"
    done
}

# Dropout's price (stage 10): the causal kernels with p = 0 and with p = 0.1 side by side, so that
# the extra instructions (Philox: ten rounds of two 32 x 32 -> 64-bit products per 16 scores) and
# the pipes they load show beside the tensor pipe.
NCUDROP_METRICS=(
    "${NCU07_METRICS[@]}"
    smsp__issue_active.avg.pct_of_peak_sustained_active
    sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active
    sm__inst_executed_pipe_fmaheavy.avg.pct_of_peak_sustained_active
    sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active
    sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active
    sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active
    sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active
)

# The awk both Nsight Compute tables (ncudrop's, ncugqa's) begin with: numbers without their
# commas, times in microseconds, bytes in MB, and the counters both print (time, warp
# instructions, issue slots, the tensor pipe, local loads).
NCU_TABLE_AWK='
    function num(s) { gsub(",", "", s); return s + 0 }
    function scaled(unit, v) { return unit == "ms" ? v * 1000 : unit == "s" ? v * 1e6 : v }
    function mb(unit, v) { return unit == "Gbyte" ? v * 1000 : unit == "Kbyte" ? v / 1000 : unit == "byte" ? v / 1e6 : v }
    /gpu__time_duration.sum/ { t = scaled($(NF-1), num($NF)) }
    /smsp__inst_executed.sum/ { inst = num($NF) }
    /smsp__issue_active.avg.pct/ { issue = num($NF) }
    /hmma_cycles_active/ { tc = num($NF) }
    /local_op_ld.sum/ { lmem = NF == 3 ? mb($(NF-1), num($NF)) : num($NF) / 1e6 }
'

# The grouped heads' price: stage 09's main backward kernel (atomic dQ) of a causal call, or with
# NCUGQA_STAGE=07 stage 07's forward kernel, plain and with groups G = 4, 8 (stage 10's --model07
# G/-1/0; the backward's blocks, one per key block of a K/V head, visit the group's query heads in
# turn, split over S blocks by launch.cuh's rule; the forward's blocks go head by head, the query
# heads of a group one after another). Beside ncudrop's counters, the SMs' active cycles, busiest
# and average (their ratio is how much longer the busiest SM ran than the average one: the blocks'
# balance over the SMs), L2's hit rate and the bytes read from DRAM (what sharing K and V saves).
# shellcheck disable=SC2034  # read by name: NCU_METRICS=NCUGQA_METRICS (ncu_command's nameref)
NCUGQA_METRICS=(
    "${NCUDROP_METRICS[@]}"
    sm__cycles_active.max
    sm__cycles_active.avg
    lts__t_sector_hit_rate.pct
)

step_ncugqa() {
    local stage=${NCUGQA_STAGE:-09}
    local d=${NCUGQA_DIM:-128} n=${NCUGQA_N:-16384} g f name filter kernel what table stages
    local -a model groups=(plain 4 8)
    case $stage in
        09) kernel="$KERNEL09_TILED<" what="stage 09's main backward kernel (atomic dQ)" stages="07 09"
            table="$RESULTS/gqa_price.txt" ;;
        07) kernel="$KERNEL07<" what="stage 07's forward kernel" stages="07" table="$RESULTS/gqa_price07.txt" ;;
        *) record "FAIL  ncugqa: NCUGQA_STAGE=$stage (07 or 09)"; status=1; return 1 ;;
    esac
    note "ncugqa: the grouped heads' price in $what, causal, bf16"
    for g in "${groups[@]}"; do
        name="ncu_stage${stage}_gqa${g}_d$d"
        # The plain call's first launch of the kernel is the plain instance; a grouped call's
        # instance is a ModelFeatures one (stage 07 times the plain kernel first, then the switches).
        model=() && filter="$kernel"
        [ "$g" != plain ] && model=(--model07 "$g/-1/0") && filter="$kernel.*ModelFeatures"
        [ "$stage" = 09 ] && filter="$filter.*$ATOMIC09"
        # shellcheck disable=SC2086  # $stages is a list
        NCU_METRICS=NCUGQA_METRICS NCU_NAME_BASE=demangled ncu_one "$filter" "$name" --stages $stages --dtypes bf16 \
            --sizes "$n" --head-dims "$d" --causal yes "${model[@]}"
    done
    {
        echo "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u +%F): $what, causal, bf16, d $d, N $n, H d = 2048 (gpu_session.sh ncugqa), one launch each"
        printf '%-8s %10s %14s %8s %8s %12s %10s %8s %8s %8s %8s %8s %10s\n' groups time_us warp_inst issue% tensor% local_ld_MB \
            busiest/avg long_sb wait barrier lg_thr l2_hit% dram_MB
        for g in "${groups[@]}"; do
            f="$RESULTS/ncu_stage${stage}_gqa${g}_d${d}_metrics.txt"
            [ -f "$f" ] || continue
            awk -v g="$g" "$NCU_TABLE_AWK"'
                /sm__cycles_active.max/ { cmax = num($NF) }
                /sm__cycles_active.avg/ { cavg = num($NF) }
                /stalled_long_scoreboard/ { lsb = num($NF) }
                /stalled_wait_per/ { wt = num($NF) }
                /stalled_barrier/ { bar = num($NF) }
                /stalled_lg_throttle/ { lg = num($NF) }
                /lts__t_sector_hit_rate.pct/ { l2 = num($NF) }
                /dram__bytes_read.sum/ { dram = mb($(NF-1), num($NF)) }
                END { printf "%-8s %10.0f %14.0f %8.1f %8.1f %12.0f %10.2f %8.2f %8.2f %8.2f %8.2f %8.1f %10.0f\n", g, t, inst, issue, tc, lmem, (cavg > 0 ? cmax / cavg : 0), lsb, wt, bar, lg, l2, dram }' "$f"
        done
    } >"$table"
    tee -a "$LOGS/summary.txt" <"$table"
}

# Dropout's price in one table, from the ncudrop step's counters: per kernel and d, p 0 against
# p 0.1: the kernel's time, warp instructions, thread instructions per visible score (B H N^2 / 2
# scores at N 4096, causal: the problem bench_gpu times, B N = 16384 and H d = 2048), issue slots
# used, the tensor and ALU pipes, and local-memory (spill) bytes read.
dropout_price_table() {
    local dir=$1 k d p f
    printf '%-18s %4s %4s %10s %14s %14s %8s %8s %8s %12s\n' kernel d p time_us warp_inst inst_per_score issue% tensor% alu% local_ld_MB
    for k in stage07 stage09; do
        for d in 64 128; do
            for p in 0 0.1; do
                f="$dir/ncu_${k}_dropout${p}_d${d}_metrics.txt"
                [ -f "$f" ] || continue
                awk -v k="$k" -v d="$d" -v p="$p" "$NCU_TABLE_AWK"'
                    /sm__pipe_alu_cycles_active/ { alu = num($NF) }
                    END {
                        scores = 4 * (2048 / d) * 4096 * 4096 / 2
                        printf "%-18s %4d %4s %10.0f %14.0f %14.1f %8.1f %8.1f %8.1f %12.0f\n", k, d, p, t, inst, 32 * inst / scores, issue, tc, alu, lmem
                    }' "$f"
            done
        done
    done
}

step_ncudrop() {
    note "ncudrop: dropout's price: stage 07's forward and stage 09's backward (atomic dQ), causal, bf16, N 4096, p 0 and 0.1"
    local d p name model
    for d in ${NCUDROP_DIMS:-64 128}; do
        for p in 0 0.1; do
            # p = 0: the plain causal kernels; p = 0.1: the Dropped instances (--model07 1/-1/0/0/0.1).
            model=() && [ "$p" != 0 ] && model=(--model07 1/-1/0/0/$p)
            name="ncu_stage07_dropout${p}_d$d"
            NCU_METRICS=NCUDROP_METRICS NCU_NAME_BASE=demangled ncu_one \
                "$KERNEL07<$([ "$p" != 0 ] && echo '.*Dropped')" "$name" --stages 07 --dtypes bf16 --sizes 4096 \
                --head-dims "$d" --causal yes "${model[@]}"
            record "-- stage 07 forward, d=$d, p=$p"
            grep -E "Duration|Registers Per|Achieved Occupancy" "$RESULTS/$name.txt" | head -4 | tee -a "$LOGS/summary.txt"
            grep -E "duration|hmma|pipe_(fma|alu|xu|lsu)|issue_active|inst_executed.sum|stalled_(math|wait|short|mio|not_selected)" \
                "$RESULTS/${name}_metrics.txt" | tee -a "$LOGS/summary.txt"
            name="ncu_stage09_dropout${p}_d$d"
            NCU_METRICS=NCUDROP_METRICS NCU_NAME_BASE=demangled ncu_one \
                "$KERNEL09_TILED<$([ "$p" != 0 ] && echo '.*Dropped').*$ATOMIC09" "$name" --stages 07 09 --dtypes bf16 \
                --sizes 4096 --head-dims "$d" --causal yes "${model[@]}"
            record "-- stage 09 backward, d=$d, p=$p"
            grep -E "Duration|Registers Per|Achieved Occupancy" "$RESULTS/$name.txt" | head -4 | tee -a "$LOGS/summary.txt"
            grep -E "duration|hmma|pipe_(fma|alu|xu|lsu)|issue_active|inst_executed.sum|stalled_(math|wait|short|mio|not_selected)" \
                "$RESULTS/${name}_metrics.txt" | tee -a "$LOGS/summary.txt"
        done
    done
    {
        echo "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u +%F): dropout's price in Nsight Compute (gpu_session.sh ncudrop), bf16, causal, B 4, N 4096, H d = 2048, one launch each"
        dropout_price_table "$RESULTS"
    } >"$RESULTS/dropout_price.txt"
    tee -a "$LOGS/summary.txt" <"$RESULTS/dropout_price.txt"
}

# Stage 09's default backward beside SDPA flash's (FlashAttention-2's bwd kernel, the one issue 19's
# target names) under the same counters: time, registers and spills, instructions, shared-memory
# wavefronts, pipes and stalls, bf16, N NCUFLASH_N (4096), non-causal, d NCUFLASH_DIMS (64 128):
# ncu_stage09_ours_d<d>, ncu_flash_bwd_d<d> and the table ncu_flash09.txt.
step_ncuflash09() {
    local n=${NCUFLASH_N:-4096} d cols=()
    note "ncuflash09: stage 09's default backward kernel (atomic dQ) beside SDPA flash's, bf16, N $n, non-causal"
    for d in ${NCUFLASH_DIMS:-64 128}; do
        NCU_METRICS=NCUDROP_METRICS NCU_NAME_BASE=demangled ncu_one "$KERNEL09_TILED<.*$ATOMIC09" "ncu_stage09_ours_d$d" \
            --stages 09 --dtypes bf16 --sizes "$n" --head-dims "$d" --causal no
        NCU_METRICS=NCUDROP_METRICS ncu_command flash_bwd_dq_dk_dv "ncu_flash_bwd_d$d" \
            python3 bench/sdpa_once.py --backend flash --dtype bf16 --seq "$n" --head-dim "$d"
        record_ncu_reports "$RESULTS/ncu_stage09_ours_d$d.txt" "$RESULTS/ncu_flash_bwd_d$d.txt"
        cols+=("ours_d$d=$RESULTS/ncu_stage09_ours_d${d}_metrics.txt" "flash_d$d=$RESULTS/ncu_flash_bwd_d${d}_metrics.txt")
    done
    side_by_side_table "stage 09's default backward kernel beside SDPA flash's (gpu_session.sh ncuflash09), bf16, N $n, non-causal, B N = 16384, H d = 2048, one launch each" \
        "$RESULTS/ncu_flash09.txt" "${cols[@]}"
}

# Stage 11's default kernel beside SDPA cuDNN's forward kernel (the one criterion 5 holds it against)
# at the points of NCUCUDNN11, d:N:causal. cuDNN's kernel is found by its time: every kernel the
# forward-only call launches is listed with its duration, and the longest is profiled.
step_ncucudnn11() {
    local pt d n causal name list kernel flag
    note "ncucudnn11: stage 11's default kernel beside SDPA cuDNN's forward kernel, bf16, at ${NCUCUDNN11:-128:1024:no} (d:N:causal)"
    for pt in ${NCUCUDNN11:-128:1024:no}; do
        IFS=: read -r d n causal <<<"$pt"
        flag=()
        [ "$causal" = yes ] && flag=(--causal)
        name="d${d}_n${n}$([ "$causal" = yes ] && echo _causal)"
        list="$RESULTS/cudnn_kernels_$name.csv"
        timeout 300 ncu --clock-control none --print-kernel-base function --csv --metrics gpu__time_duration.sum \
            python3 bench/sdpa_once.py --backend cudnn --forward-only --dtype bf16 --seq "$n" --head-dim "$d" "${flag[@]}" \
            >"$list" 2>>"$LOGS/ncucudnn11.log" || status=1
        kernel=$(python3 bench/ncu_side_by_side.py --longest "$list")
        record "-- $name: cuDNN's forward launches $(grep -c '^"' "$list" | awk '{print $1 - 1}') kernels; the longest: ${kernel:-none found}"
        [ -n "$kernel" ] || { status=1; continue; }
        NCU_METRICS=NCU11_METRICS ncu_one "$KERNEL11" "ncu_stage11_$name" --stages 11 --dtypes bf16 --sizes "$n" --head-dims "$d" \
            --causal "$causal"
        NCU_METRICS=NCU11_METRICS ncu_command "^$kernel\$" "ncu_cudnn_$name" python3 bench/sdpa_once.py --backend cudnn --forward-only \
            --dtype bf16 --seq "$n" --head-dim "$d" "${flag[@]}"
        record_ncu_reports "$RESULTS/ncu_stage11_$name.txt" "$RESULTS/ncu_cudnn_$name.txt"
        side_by_side_table "stage 11's default kernel beside SDPA cuDNN's forward kernel (gpu_session.sh ncucudnn11), bf16, d $d, N $n, causal $causal, B N = 16384, H d = 2048, one launch each" \
            "$RESULTS/ncu_cudnn11_$name.txt" "stage11=$RESULTS/ncu_stage11_${name}_metrics.txt" "cudnn=$RESULTS/ncu_cudnn_${name}_metrics.txt"
    done
}

# The launch (grid, block) and the occupancy lines of each Nsight Compute report of "$@", in the summary.
record_ncu_reports() {
    local r
    for r in "$@"; do
        record "-- $(basename "$r" .txt): $(grep -m1 -E '\(([0-9]+), ([0-9]+), ([0-9]+)\)x\(' "$r" | sed 's/^ *//' | cut -c1-160)"
        grep -E "Registers Per|Dynamic Shared Memory Per|Static Shared Memory Per|Achieved Occupancy" "$r" | head -4 | tee -a "$LOGS/summary.txt"
    done
}

# bench/ncu_side_by_side.py of the counters "label=path" of "$@" (after $1 and $2) into $2, headed
# by the GPU, the date and $1; and into the summary.
side_by_side_table() {
    local head=$1 out=$2
    shift 2
    {
        echo "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u +%F): $head"
        python3 bench/ncu_side_by_side.py "$@"
    } >"$out"
    tee -a "$LOGS/summary.txt" <"$out"
}

# Stage 09's backward on a packed batch of equal lengths beside the dense kernel on the same tokens
# (the gap issue 18 names: packed / dense on a uniform batch), under the same counters: bench_gpu
# --varlen07 with NCUVARLEN_LENGTHS (default four of 4096: B N = 16384, causal in each sequence),
# bf16, d NCUVARLEN_DIMS (64 128), atomic dQ: ncu_stage09_packed_d<d>, ncu_stage09_dense_d<d> and
# the table ncu_varlen09.txt.
step_ncuvarlen09() {
    local lengths=${NCUVARLEN_LENGTHS:-4096,4096,4096,4096} d cols=() default
    default=$(stage09_default_step)
    note "ncuvarlen09: stage 09's backward (atomic dQ) on the packed batch $lengths beside the dense kernel (step ${default:-?}), bf16, causal"
    if [ -z "$default" ]; then
        record "FAIL  ncuvarlen09: could not read the default step from $STAGE09 --help"
        status=1
        return 0
    fi
    for d in ${NCUVARLEN_DIMS:-64 128}; do
        # The packed rows run before the sweep: the first Packed launch is the packed batch's, the
        # first plain launch of the default step the dense batch's (stage10_dense_uniform).
        NCU_METRICS=NCUDROP_METRICS NCU_NAME_BASE=demangled ncu_one "$KERNEL09_TILED<.*Packed<.*$ATOMIC09" \
            "ncu_stage09_packed_d$d" --stages 07 09 --dtypes bf16 --sizes 4096 --head-dims "$d" --causal yes --varlen07 "$lengths"
        NCU_METRICS=NCUDROP_METRICS NCU_NAME_BASE=demangled ncu_one "$(instance09 "$default" "$d")" \
            "ncu_stage09_dense_d$d" --stages 07 09 --dtypes bf16 --sizes 4096 --head-dims "$d" --causal yes --varlen07 "$lengths"
        record_ncu_reports "$RESULTS/ncu_stage09_packed_d$d.txt" "$RESULTS/ncu_stage09_dense_d$d.txt"
        cols+=("packed_d$d=$RESULTS/ncu_stage09_packed_d${d}_metrics.txt" "dense_d$d=$RESULTS/ncu_stage09_dense_d${d}_metrics.txt")
    done
    side_by_side_table "stage 09's backward on a packed batch ($lengths) beside the dense kernel on the same tokens (gpu_session.sh ncuvarlen09), bf16, causal, one launch each" \
        "$RESULTS/ncu_varlen09.txt" "${cols[@]}"
}

# Stage 09's packed backward beside the dense kernel, instruction by instruction: one launch of
# each on four 4096-token sequences (packed, then dense), bf16, d NCUSOURCE_D (64), causal, atomic
# dQ, under Nsight Compute's SourceCounters section; each report's source page (per SASS
# instruction: instructions executed, warp-state samples) summed by opcode by
# bench/ncu_source_diff.py: ncu_source09.txt, and the two pages as ncu_source09_<kernel>.csv.
step_ncusource09() {
    local d=${NCUSOURCE_D:-64} default name pattern out="$RESULTS/ncu_source09.txt"
    default=$(stage09_default_step)
    note "ncusource09: stage 09's packed backward beside the dense one (step ${default:-?}), per SASS opcode, bf16, d=$d, causal"
    if [ -z "$default" ]; then
        record "FAIL  ncusource09: could not read the default step from $STAGE09 --help"
        status=1
        return 0
    fi
    mkdir -p "$WORK/ncu-rep"
    for name in packed dense; do
        if [ "$name" = packed ]; then pattern="$KERNEL09_TILED<.*Packed<.*$ATOMIC09"; else pattern=$(instance09 "$default" "$d"); fi
        timeout 300 ncu --clock-control none --kernel-name-base demangled -k "regex:$pattern" --launch-count 1 \
            --section SourceCounters --section LaunchStats --force-overwrite -o "$WORK/ncu-rep/source09_$name" \
            "$BUILD/bench/bench_gpu" --stages 07 09 --dtypes bf16 --sizes 4096 --head-dims "$d" --causal yes \
            --varlen07 4096,4096,4096,4096 --repeat 1 --warmup 0 --check false >>"$LOGS/ncusource09.log" 2>&1 || status=1
        ncu -i "$WORK/ncu-rep/source09_$name.ncu-rep" --page source --csv --print-source sass \
            >"$RESULTS/ncu_source09_$name.csv" 2>>"$LOGS/ncusource09.log" || status=1
    done
    {
        echo "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u +%F): stage 09's backward on four 4096-token sequences, packed, beside the dense kernel"
        echo "(step $default) on the same tokens, bf16, d = $d, causal, atomic dQ, one launch each (gpu_session.sh ncusource09)"
        echo
        python3 bench/ncu_source_diff.py "packed=$RESULTS/ncu_source09_packed.csv" "dense=$RESULTS/ncu_source09_dense.csv"
    } >"$out" 2>&1 || status=1
    tee -a "$LOGS/summary.txt" <"$out"
}

# Stage 11's kernel instruction by instruction: one launch per NCUSOURCE11 entry ("step:d:N:causal",
# default "default:128:1024:no default:64:1024:no"; step "default" times the stage's default), bf16, B*N = 16384, H*d = 2048, under Nsight Compute's
# SourceCounters section. Each report's source page goes out twice: per SASS instruction
# (ncu_source11_<entry>_sass.csv) and per line of CUDA source with its SASS beneath (-lineinfo;
# ncu_source11_<entry>_cuda.csv). bench/ncu_source_lines.py sums the warp samples by source line
# and by the kernel's snippets (the `//! [name]` regions the lesson quotes: the softmax, the
# epilogue, the producer's loop): ncu_source11.txt says where in the code the warps' time goes.
step_ncusource11() {
    local entries=${NCUSOURCE11:-default:128:1024:no default:64:1024:no}
    local spec step d n causal name out="$RESULTS/ncu_source11.txt" pages=() steps=()
    note "ncusource11: stage 11's kernel per source line and SASS instruction ($entries), bf16"
    mkdir -p "$WORK/ncu-rep"
    for spec in $entries; do
        IFS=: read -r step d n causal <<<"$spec"
        steps=()
        [ "$step" = default ] || steps=(--steps11 "$step")  # bench_gpu times the default without --steps11
        name="s${step}_d${d}_n${n}_$([ "$causal" = yes ] && echo causal || echo full)"
        timeout 300 ncu --clock-control none -k "regex:$KERNEL11" --launch-count 1 --import-source yes \
            --section SourceCounters --section WarpStateStats --section LaunchStats --force-overwrite \
            -o "$WORK/ncu-rep/source11_$name" "$BUILD/bench/bench_gpu" --stages 11 "${steps[@]}" --dtypes bf16 \
            --sizes "$n" --head-dims "$d" --causal "$causal" --repeat 1 --warmup 0 --check false >>"$LOGS/ncusource11.log" 2>&1 \
            || status=1
        ncu -i "$WORK/ncu-rep/source11_$name.ncu-rep" --page source --csv --print-source sass \
            >"$RESULTS/ncu_source11_${name}_sass.csv" 2>>"$LOGS/ncusource11.log" || status=1
        ncu -i "$WORK/ncu-rep/source11_$name.ncu-rep" --page source --csv --print-source cuda,sass \
            >"$RESULTS/ncu_source11_${name}_cuda.csv" 2>>"$LOGS/ncusource11.log" || status=1
        pages+=("$name=$RESULTS/ncu_source11_${name}_cuda.csv,$RESULTS/ncu_source11_${name}_sass.csv")
    done
    {
        echo "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u +%F): stage 11 per source line (gpu_session.sh ncusource11), bf16, B*N = 16384, H*d = 2048, one launch each"
        python3 bench/ncu_source_lines.py "${pages[@]}" --top 20 --snippets stages/11_hopper_kernel/kernel.cuh
    } >"$out" 2>&1 || status=1
    tee -a "$LOGS/summary.txt" <"$out"
}

# What explains each step of stage 05's road: DRAM and L2 traffic, global-load efficiency,
# shared-memory wavefronts and bank conflicts, occupancy, registers, instructions, stalls.
NCU05ROAD_METRICS=(
    gpu__time_duration.sum
    dram__throughput.avg.pct_of_peak_sustained_elapsed
    dram__bytes_read.sum
    lts__t_bytes.sum
    l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum
    l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum
    l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum
    l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum
    l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
    l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum
    l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum
    sm__warps_active.avg.pct_of_peak_sustained_active
    launch__registers_per_thread
    launch__occupancy_limit_registers
    launch__occupancy_limit_shared_mem
    smsp__inst_executed.sum
    smsp__sass_thread_inst_executed_op_ffma_pred_on.sum
    sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active
    sm__throughput.avg.pct_of_peak_sustained_elapsed
    smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio
    smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
    smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio
    smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio
)
step_ncu05road() {
    note "ncu05road: every step of stage 05's road, float32, d=64 N=2048 (B=8 H=32) non-causal, one launch each"
    local s out="$RESULTS/ncu_stage05_road.txt"
    {
        echo "Nsight Compute on every step of stage 05's road, $(nvidia-smi --query-gpu=name --format=csv,noheader), $(date -u +%F)."
        echo "bench/gpu_session.sh ncu05road: ncu --clock-control none -k regex:'attention_kernel|row_per_thread|block_tile'"
        echo "    --launch-count 1 --metrics ... bench_gpu --stages 05 --road05 --sizes 2048 --head-dims 64 --causal no"
        echo "(bench_gpu runs each step twice, untimed then timed after an L2 flush, steps 0 to 5 first and the final"
        echo " kernel last: launch 2k+1 of the regex, the timed run, is step k)"
    } >"$out"
    for s in 0 1 2 3 4 5 6; do
        echo "---- step $s" >>"$out"
        timeout 300 ncu --clock-control none -k "regex:attention_kernel|row_per_thread_kernel|block_tile_kernel" \
            --launch-skip $((2 * s + 1)) --launch-count 1 --metrics "$(known_metrics "${NCU05ROAD_METRICS[@]}" 2>/dev/null)" \
            "$BUILD/bench/bench_gpu" --stages 05 --road05 --sizes 2048 --head-dims 64 --causal no --repeat 1 --warmup 0 \
            --check false --json /tmp/ncu.json --csv /tmp/ncu.csv 2>&1 | strip_bench \
            | grep -v -E "^==PROF==|^==WARNING==|Warning: Data collection" >>"$out" || status=1
    done
    grep -E "^---- step|\(|gpu__time|bank_conflicts|warps_active|registers_per" "$out" | tee -a "$LOGS/summary.txt"
}

step_ncu07road() {
    note "ncu07road: shared-memory bank conflicts, road steps ${NCU_ROAD_STEPS:-1 2}, bf16, d=64 N=4096 non-causal"
    local s
    for s in ${NCU_ROAD_STEPS:-1 2}; do
        timeout 300 ncu --clock-control none -k "regex:$KERNEL07" --launch-count 1 \
            --metrics "$(known_metrics "${NCUROAD_METRICS[@]}" 2>/dev/null)" \
            "$BUILD/bench/bench_gpu" --stages 07 --dtypes bf16 --steps "$s" --sizes 4096 --head-dims 64 --causal no \
            --repeat 1 --warmup 0 --check false --json /tmp/ncu.json --csv /tmp/ncu.csv 2>&1 \
            | strip_bench >"$RESULTS/ncu_stage07_step$s.txt" || status=1
        record "-- step $s"
        grep -E "gpu__time|hmma|bank_conflicts|wavefronts|ldsm|shared_(ld|st)|ldgsts" "$RESULTS/ncu_stage07_step$s.txt" | tee -a "$LOGS/summary.txt"
    done
}

step_lessons() {
    note "lesson runs (LESSON_ARGS)"
    "$STAGE05" --heads 16 --seq-q 2048 --seq-k 2048 --head-dim 64 --bench >"$RESULTS/stage05_run.txt" 2>&1 || status=1
    "$STAGE06" --heads 16 --seq-q 2048 --seq-k 2048 --head-dim 64 --causal --bench >"$RESULTS/stage06_run.txt" 2>&1 || status=1
    "$STAGE07" --heads 16 --seq-q 2048 --seq-k 2048 --head-dim 64 --causal --bench >"$RESULTS/stage07_run.txt" 2>&1 || status=1
    "$STAGE09" --heads 4 --seq-q 1000 --seq-k 1000 --head-dim 64 --causal --bench >"$RESULTS/stage09_run.txt" 2>&1 || status=1
    "$STAGE09" --bench --batch 4 --heads 32 --seq-q 4096 --seq-k 4096 --reference never >"$RESULTS/stage09_bench_run.txt" 2>&1 \
        || status=1
    "$STAGE10" --seqlens 700,37,1200,1,300 --heads 8 --kv-heads 2 --head-dim 64 --causal --bench >"$RESULTS/stage10_run.txt" 2>&1 \
        || status=1
    tail -n 4 "$RESULTS/stage05_run.txt" "$RESULTS/stage06_run.txt" "$RESULTS/stage07_run.txt" "$RESULTS/stage09_run.txt" \
        "$RESULTS/stage09_bench_run.txt" "$RESULTS/stage10_run.txt" | tee -a "$LOGS/summary.txt"
}

# Packs what is there so far: after every step, so a call cut short by its time limit still
# returns the steps it finished ...
pack() {
    local part="$OUT/session.tgz.part.$BASHPID"  # the background packer and the steps each write their own
    tar czf "$part" -C "$WORK" logs results 2>/dev/null && mv -f "$part" "$OUT/session.tgz"
    rm -f "$part"
    cp "$LOGS/summary.txt" "$OUT/summary.txt.part.$BASHPID" 2>/dev/null && mv -f "$OUT/summary.txt.part.$BASHPID" "$OUT/summary.txt"
}

# ... and every PACK_EVERY seconds (default 30) in the background, so that a call cut inside a long
# step (a sweep, a sanitizer, test.sh) still returns that step's logs and what it wrote so far.
# Its output goes nowhere, so that a sleep it leaves behind holds no pipe of the caller's open.
( while sleep "${PACK_EVERY:-30}"; do pack; done ) </dev/null >/dev/null 2>&1 &
packer=$!
trap 'kill "$packer" 2>/dev/null' EXIT

for step in "$@"; do
    if ! declare -F "step_$step" >/dev/null; then
        record "unknown step '$step': use newcomer newcomer_test newcomer_test_start newcomer_wait build prebuilt test test11 traps11 sanitize ceiling road05 road road11 groups11 timeline11 switches07 stage10 order07 order09 split09 road09 timing sweep07 sweep09 sweep quick ncu ncu05road ncu07 ncu07road ncu09 ncu09at ncudrop ncugqa ncuflash09 ncucudnn11 ncusource09 ncusource11 ncu11 ncu11road lessons"
        status=2
        continue
    fi
    t_step=$SECONDS
    "step_$step" || { status=1; [ "$step" = build ] && break; }
    record "[$step: $((SECONDS - t_step)) s, $((SECONDS - start_all)) s since the start]"
    pack
done
note "done, status $status, $((SECONDS - start_all)) s"
pack
exit $status
