"""Stage 11's experiments (the Hopper forward: TMA, mbarrier rings, wgmma, warp specialization;
sm_90a): its road beside SDPA, its tests, its compiler traps, one block's timeline, and Nsight
Compute's counters at every step.

Ported from bench/gpu_session.sh's steps `road11`, `test11`, `traps11`, `timeline11` and
`ncu11road` with the same commands; their environment variables (ROAD11_STEPS, TIMELINE11_SHAPES,
NCU11_DIMS, ...) became the parameters below.
"""
import re

from .experiment import Command, Experiment, Glob, Where, file_lines, grep, in_results, tail
from .tools import COMPARE_OUTPUTS, COMPARE_TARGETS, ROUNDS_HELP, compare, compare_summary, yes_no

STAGE11 = "stages/11_hopper_kernel/stage11_hopper_kernel"
KERNEL11 = "hopper_forward_kernel"  # stage 11's kernel (every step but 0), as Nsight Compute filters it


def _road11_commands(p, ctx):
    return [compare(ctx, "road11", p["rounds"], "--stages", "11", "--dtypes", *p["dtypes"], "--steps11", *p["steps"],
                    "--sizes", *(str(n) for n in p["sizes"]), "--head-dims", "64", "128", "--repeat", "20",
                    "--warmup", "3")]


def _check_road11(p):
    if any(d not in ("bf16", "fp16") for d in p["dtypes"]):
        raise ValueError(f"dtypes must be bf16 or fp16, not {','.join(p['dtypes'])}")
    _check_steps(p["steps"])


def _check_steps(steps):
    if steps != ("all",) and not all(s.isdigit() for s in steps):
        raise ValueError(f"steps must be all or step numbers (like 0,8,9), not {','.join(steps)}")


ROAD11 = Experiment(
    name="road11",
    stage="11",
    description="stage 11, every step of its road (step 0: stage 07's final kernel), d 64/128, causal and not, "
                "beside SDPA flash and cuDNN, each step checked against stage 07's final kernel",
    targets=COMPARE_TARGETS,
    params={"steps": ("all",), "dtypes": ("bf16",), "sizes": (1024, 4096, 16384), "rounds": 3},
    param_help={
        "steps": "steps of the road (--steps11): all, or numbers such as 0,8,9",
        "dtypes": "bf16, fp16 or both (--dtypes)",
        "sizes": "sequence lengths N (--sizes; B*N = 16384, H*d = 2048)",
        "rounds": ROUNDS_HELP,
    },
    commands=_road11_commands,
    outputs=COMPARE_OUTPUTS + ("road11.csv", "road11.json", "stage11_road_table.txt", "stage11_sweep_table.txt",
                               "ratios_over_rounds.txt"),
    summary=compare_summary,
    check=_check_road11,
)


def _test11_commands(p, ctx):
    # A kernel that hangs (a barrier's phases out of step) fails its test after the timeout.
    return [Command(("ctest", "--test-dir", ctx.build, "--output-on-failure", "-R", "hopper|stage11", "-j4",
                     "--timeout", str(p["timeout"])))]


def _test11_summary(where: Where):
    """Each test's verdict, the count that passed, those that failed or were skipped (last 25)."""
    return grep(where.log, r"Test +#|tests passed|tests failed|Skipped|Failed")[-25:]


TEST11 = Experiment(
    name="test11",
    stage="11",
    description="the tests of stage 11 and of Hopper's wrappers (ctest -R 'hopper|stage11'): host maps, wrappers, "
                "every step, the reading files bit for bit, the shared-memory map, the command line",
    targets=("make_npy_inputs", "stage11_hopper_kernel", "test_hopper_layouts", "test_hopper_wrappers", "test_stage11",
             "test_stage11_schedule", "test_stage11_smem_map", "test_stage11_steps", "wgmma_ceiling"),
    params={"timeout": 240},
    param_help={"timeout": "seconds before ctest fails one test (a hung barrier)"},
    commands=_test11_commands,
    outputs=(),  # CTest writes nothing but its log (WORK/logs/test11.log)
    summary=_test11_summary,
)


def _traps11_commands(p, ctx):
    out = ctx.results("traps11")
    return [Command(("python3", "bench/traps11.py", "--check", "--json", f"{out}/stage11_traps.json",
                     "--table", f"{out}/stage11_traps_table.txt"))]


def _traps11_summary(where: Where):
    """The table of traps and fixes (ptxas's messages, SASS counts) and traps11.py's verdict."""
    return file_lines(in_results(where, "stage11_traps_table.txt")) + tail(where.log, 1)


TRAPS11 = Experiment(
    name="traps11",
    stage="11",
    description="stage 11's compiler traps (bench/traps11.py): ptxas's messages and the SASS counts of each trap "
                "and its fix, checked",
    targets=(),  # traps11.py compiles traps.cu itself with nvcc
    params={},
    param_help={},
    commands=_traps11_commands,
    outputs=("stage11_traps.json", "stage11_traps_table.txt"),
    summary=_traps11_summary,
)


def _shape(spec: str):
    """'d:N:causal' (causal 0 or 1) as (d, N, causal, the records' name for it)."""
    d, n, causal = spec.split(":")
    return int(d), int(n), causal == "1", f"d{d}_n{n}" + ("_causal" if causal == "1" else "")


def _check_timeline11(p):
    bad = [s for s in p["shapes"] if not re.fullmatch(r"[0-9]+:[0-9]+:[01]", s)]
    if bad:
        raise ValueError(f"shapes are d:N:causal with causal 0 or 1 (like 128:4096:0), not {','.join(bad)}")


def _timeline11_commands(p, ctx):
    out, cmds = ctx.results("timeline11"), []
    for spec in p["shapes"]:
        d, n, causal, name = _shape(spec)
        for step in p["steps"]:
            cmds.append(Command((ctx.exe(STAGE11), "--batch", str(16384 // n), "--heads", str(2048 // d), "--seq-q", str(n),
                                 "--seq-k", str(n), "--head-dim", str(d), *(["--causal"] if causal else []),
                                 "--step", str(step), "--bench", "--repeat", "20", "--warmup", "3", "--reference", "never",
                                 "--timeline", f"{out}/stage11_timeline_{name}_step{step}.json")))
        cmds.append(Command(("python3", "docs/make_timeline.py", "--out", f"{out}/timeline_{name}.svg", "--table",
                             f"{out}/timeline_table_{name}.txt", Glob(f"{out}/stage11_timeline_{name}_step*.json"))))
    return cmds


def _timeline11_summary(where: Where):
    """Each shape's table of where each warpgroup's cycles went, then the log's timeline and failure lines."""
    lines = []
    for spec in where.params["shapes"]:
        lines += file_lines(in_results(where, f"timeline_table_{_shape(spec)[3]}.txt"))
    return lines + grep(where.log, r"^timeline:|FAIL|error")


TIMELINE11 = Experiment(
    name="timeline11",
    stage="11",
    description="stage 11's instrumented build: one thread block's marks (timeline.hpp) at several steps and "
                "shapes, bf16, each timed beside its plain build; docs/make_timeline.py draws and tabulates them",
    targets=("stage11_hopper_kernel",),
    params={"steps": (3, 4, 5, 8, 9, 10), "shapes": ("128:4096:0", "64:4096:0", "128:1024:0", "64:1024:1")},
    param_help={
        "steps": "steps of the road to record (--step)",
        "shapes": "d:N:causal, B*N = 16384, H*d = 2048 (the lesson reads d64/d128 N 4096 steps 3,4,5,8)",
    },
    commands=_timeline11_commands,
    outputs=("stage11_timeline_{shape}_step{step}.json", "timeline_{shape}.svg", "timeline_table_{shape}.txt"),
    summary=_timeline11_summary,
    check=_check_timeline11,
)

# Stage 11's counters: the tensor pipe as wgmma drives it (and as mma.sync would, to see that none
# of it is left), the special-function pipe (exp2), registers and occupancy, shared-memory traffic,
# the stall reasons (a warp waiting on an mbarrier or a wgmma shows as long scoreboard or wait).
NCU11_METRICS = (
    "gpu__time_duration.sum",
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
    "launch__registers_per_thread",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
    "dram__bytes_read.sum",
    "smsp__inst_executed.sum",
) + tuple(f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in (
    "barrier", "membar", "long_scoreboard", "short_scoreboard", "mio_throttle", "math_pipe_throttle", "wait",
    "sleeping", "not_selected", "selected", "dispatch_stall", "no_instruction", "branch_resolving"))


def _ncu11road_commands(p, ctx):
    out, n, cmds = ctx.results("ncu11road"), p["size"], []
    steps = p["steps"]
    for d in p["dims"]:
        metrics = ctx.known_metrics(NCU11_METRICS, ctx.log("ncu11road"))
        cmds.append(Command(("timeout", "500", "ncu", "--clock-control", "none", "-k", f"regex:{KERNEL11}", "--metrics",
                             metrics, ctx.exe("bench/bench_gpu"), "--stages", "11", "--steps11", *steps, "--dtypes", "bf16",
                             "--sizes", str(n), "--head-dims", str(d), "--causal", yes_no(p["causal"]), "--repeat", "1",
                             "--warmup", "0", "--check", "false", "--json", "/tmp/ncu.json", "--csv", "/tmp/ncu.csv"),
                            stdout=f"{out}/ncu_stage11_road_d{d}_metrics.txt"))
    mask = "causal" if p["causal"] else "non-causal"
    head = (f"{ctx.gpu_name()}, {ctx.date()}: stage 11's road in Nsight Compute counters (bench/session.py ncu11road), "
            f"bf16, {mask}, B {16384 // n}, N {n}, H d = 2048, the first launch of each step")
    cmds.append(Command(("python3", "bench/ncu_steps11.py", *(f"{out}/ncu_stage11_road_d{d}_metrics.txt" for d in p["dims"])),
                        stdout=f"{out}/ncu_stage11_road.txt", header=(head,)))
    return cmds


NCU11ROAD = Experiment(
    name="ncu11road",
    stage="11",
    description="Nsight Compute's counters at every step of stage 11's road, bf16, B*N = 16384, H*d = 2048: tensor "
                "pipe (wgmma), exp2, FMA/ALU, issue slots, registers, the epilogue's stores, stall reasons",
    targets=("bench_gpu",),
    params={"steps": ("all",), "dims": (64, 128), "size": 4096, "causal": False},
    param_help={
        "steps": "steps of the road (--steps11): all, or numbers",
        "dims": "head dimensions, one ncu run each",
        "size": "sequence length N",
        "causal": "a causal mask (--causal yes)",
    },
    commands=_ncu11road_commands,
    outputs=("ncu_stage11_road_d{d}_metrics.txt", "ncu_stage11_road.txt"),
    summary="ncu_stage11_road.txt",
    check=lambda p: _check_steps(p["steps"]),
)

EXPERIMENTS = (ROAD11, TEST11, TRAPS11, TIMELINE11, NCU11ROAD)
