"""Nsight Compute as gpu_session.sh's ncu steps ran it: the counters each report reads, one launch
of a kernel under the sections and then under the counters (ncu_command), the regexes of stage
09's kernel instances, bench_gpu's own lines dropped from a profiled run (strip_bench), and the
tables the script drew with awk (dropout's price, the grouped heads' price).
"""
from __future__ import annotations

import os
import re

from .experiment import Command, file_lines, grep

KERNEL07 = "flash_forward_kernel"  # stage 07's kernel, as Nsight Compute filters it
KERNEL09 = "flash_backward_kernel"  # stage 09's main kernel of step 0 (between its pre- and postprocessing)
KERNEL09_TILED = "flash_backward_tiled_kernel"  # stage 09's steps from 1 (bench_gpu --steps09 1 2 3 ...)
ATOMIC09 = r"\(bool\)0>\("  # the instance with atomic dQ, demangled: "..., (bool)0>(fa::stage09::Args<T1>)"
KERNEL11 = "hopper_forward_kernel"  # stage 11's kernel (every step but 0)
BENCH_NCU = ("--repeat", "1", "--warmup", "0", "--check", "false", "--json", "/tmp/ncu.json", "--csv", "/tmp/ncu.csv")
ANY_EXIT = tuple(range(256))  # a run whose failure the script ignored (|| true)

_STALLS = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"

# Counters of the stage 07 reports: tensor-pipe use, shared-memory traffic and bank conflicts,
# ldmatrix and cp.async instructions, spills, the special-function pipe (ex2), the stall reasons.
NCU07_METRICS = (
    "gpu__time_duration.sum",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
    "smsp__inst_executed_op_ldsm.sum",
    "smsp__sass_inst_executed_op_ldsm.sum",
    "smsp__sass_inst_executed_op_shared_ld.sum",
    "smsp__sass_inst_executed_op_shared_st.sum",
    "smsp__sass_inst_executed_op_ldgsts.sum",
    "smsp__inst_executed.sum",
    "launch__registers_per_thread",
    "launch__occupancy_limit_registers",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
    "dram__bytes_read.sum",
) + tuple(_STALLS.format(r) for r in (
    "barrier", "long_scoreboard", "short_scoreboard", "mio_throttle", "math_pipe_throttle", "wait", "not_selected",
    "selected", "dispatch_stall", "lg_throttle", "no_instruction", "branch_resolving")) + (
    "smsp__inst_executed_op_global_red.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_red.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_red.sum",
    "lts__t_sectors_srcunit_tex_op_red.sum",
)

# The counters the lesson quotes for stage 07's road's ldmatrix and swizzle steps.
NCUROAD_METRICS = NCU07_METRICS[:2] + NCU07_METRICS[3:11] + ("smsp__sass_inst_executed_op_ldgsts.sum",)

# Dropout's price (stage 10): the extra instructions (Philox) and the pipes they load beside the tensor pipe.
NCUDROP_METRICS = NCU07_METRICS + (
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_fmaheavy.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",
    "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
)

# The grouped heads' price: beside dropout's counters, the SMs' busiest and average active cycles
# (the blocks' balance), L2's hit rate and the bytes read from DRAM.
NCUGQA_METRICS = NCUDROP_METRICS + ("sm__cycles_active.max", "sm__cycles_active.avg", "lts__t_sector_hit_rate.pct")

# What explains each step of stage 05's road: DRAM and L2 traffic, global-load efficiency,
# shared-memory wavefronts and bank conflicts, occupancy, registers, instructions, stalls.
NCU05ROAD_METRICS = (
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes_read.sum",
    "lts__t_bytes.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem",
    "smsp__inst_executed.sum",
    "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
) + tuple(_STALLS.format(r) for r in ("short_scoreboard", "long_scoreboard", "mio_throttle", "barrier"))

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

_BENCH_LINE = re.compile(r"^\[ *[0-9]+/ *[0-9]+\]|^(gpu|method|wrote|stage 0[79]|stage 11|skipped) "
                         r"|^ +(vs|skipped|stage 0|stage09_step[0-9]+:|forward \+ backward|guard:)")
_NCU_NOISE = re.compile(r"^==PROF==|^==WARNING==|Warning: Data collection")


def strip_bench(lines):
    """bench_gpu's own lines dropped from a profiled run's output (its timings under replays mean nothing)."""
    return [line for line in lines if not _BENCH_LINE.search(line)]


def strip_bench_and_ncu(lines):
    """strip_bench, and Nsight Compute's own notices (==PROF==, ==WARNING==, data collection)."""
    return [line for line in strip_bench(lines) if not _NCU_NOISE.search(line)]


def ncu_command(ctx, exp: str, kernel: str, name: str, metrics, argv, base="function") -> list:
    """One launch of the kernel (a regex) under Nsight Compute: the first launch with the sections
    into WORK/ncu-rep/NAME.ncu-rep, its text into NAME.txt, then the counters into NAME_metrics.txt
    (bench_gpu's lines dropped). base "demangled" lets the regex name template arguments."""
    out, reps, log = ctx.results(exp), os.path.join(ctx.work, "ncu-rep"), ctx.log(exp)
    rep = os.path.join(reps, name)
    sections = ctx.known_sections(("SpeedOfLight", "Occupancy", "LaunchStats", "MemoryWorkloadAnalysis",
                                   "MemoryWorkloadAnalysis_Tables", "ComputeWorkloadAnalysis", "WarpStateStats"), log)
    head = ("timeout", "300", "ncu", "--clock-control", "none", "--kernel-name-base", base, "-k", f"regex:{kernel}",
            "--launch-count", "1")
    text = 'ncu --import "$1" --page details --print-details all 2>/dev/null || ncu --import "$1" --page details'
    return [
        Command(("mkdir", "-p", reps)),
        Command((*head, "--force-overwrite", "-o", rep, *sections, *argv)),
        Command(("sh", "-c", text, "ncu_text", rep + ".ncu-rep"), stdout=f"{out}/{name}.txt"),
        Command((*head, "--metrics", ctx.known_metrics(metrics, log), *argv), stdout=f"{out}/{name}_metrics.txt",
                filter=strip_bench),
    ]


def ncu_one(ctx, exp: str, kernel: str, name: str, metrics, *args, base="function") -> list:
    """ncu_command on one bench_gpu run (one launch, no check) with args."""
    return ncu_command(ctx, exp, kernel, name, metrics, (ctx.exe("bench/bench_gpu"), *BENCH_NCU, *args), base)


def report_lines(results: str, name: str, report: str, metrics: str, limit: int = 20) -> list:
    """The lines of report NAME.txt that match report (at most limit), then those of
    NAME_metrics.txt that match metrics (gpu_session.sh's two greps after each ncu_one)."""
    return grep(os.path.join(results, f"{name}.txt"), report, limit) + \
        grep(os.path.join(results, f"{name}_metrics.txt"), metrics)


def launch_lines(results: str, *names: str) -> list:
    """Each report's launch (grid, block) and its registers, shared memory and occupancy lines."""
    out = []
    for name in names:
        path = os.path.join(results, f"{name}.txt")
        first = grep(path, r"\(([0-9]+), ([0-9]+), ([0-9]+)\)x\(", 1)
        out.append(f"-- {name}: " + (first[0].lstrip()[:160] if first else ""))
        out += grep(path, "Registers Per|Dynamic Shared Memory Per|Static Shared Memory Per|Achieved Occupancy", 4)
    return out


def side_by_side(ctx, exp: str, head: str, table: str, cols) -> Command:
    """bench/ncu_side_by_side.py of the counters label=path into TABLE, headed by the GPU, the date and head."""
    return Command(("python3", "bench/ncu_side_by_side.py", *cols), stdout=os.path.join(ctx.results(exp), table),
                   header=(f"{ctx.gpu_name()}, {ctx.date()}: {head}",))


_SHAPES09 = {
    "1:128": r"[^<]*TiledFeatures<\(int\)128, \(int\)64,",
    "2:128": r"[^<]*TiledFeatures<\(int\)64, \(int\)128,", "4:128": r"[^<]*TiledFeatures<\(int\)64, \(int\)128,",
    "5:128": r"[^<]*TiledFeatures<\(int\)64, \(int\)128,", "3:128": r".*WithDpPieces<",
    "1": r"[^<]*TiledFeatures<", "2": r"[^<]*TiledFeatures<", "3": r"[^<]*TiledFeatures<",
    "4": r"[^<]*WithPtInRegisters<[^<]*TiledFeatures<[^>]*, \(int\)32, \(int\)1>",
    "5": r"[^<]*WithPtInRegisters<[^<]*TiledFeatures<[^>]*, \(int\)16, \(int\)1>",
    "6": r"[^<]*WithFreshLanes<", "7": r"[^<]*WithDqAdds<.*>, \(int\)1>", "8": r"[^<]*WithDqAdds<.*>, \(int\)4>",
    "9": r"[^<]*WithDqTiles<[^<]*(WithPtInRegisters|TiledFeatures)<", "10": r"[^<]*WithDqTiles<[^<]*WithDqAdds<",
}


def instance09(step, d) -> str:
    """The regex of the warp-tiled kernel instance of stage 09's step at head dimension d, as Nsight
    Compute demangles it, atomic dQ (gpu_session.sh's instance09; an unknown step: no shape)."""
    shape = _SHAPES09.get(f"{step}:{d}", _SHAPES09.get(str(step), ""))
    return rf"{KERNEL09_TILED}<[^,]*, \(int\){d}, {shape}.*{ATOMIC09}"


def _num(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def ncu_values(path: str) -> dict:
    """The counters both awk tables of gpu_session.sh read from a _metrics.txt: time (us), warp
    instructions, issue and tensor-pipe %, local loads (MB), and the others by their key."""
    v = {}
    scale = {"ms": 1000.0, "s": 1e6}
    mb = {"Gbyte": 1000.0, "Kbyte": 1e-3, "byte": 1e-6}
    keys = {"sm__pipe_alu_cycles_active": "alu", "sm__cycles_active.max": "cmax", "sm__cycles_active.avg": "cavg",
            "stalled_long_scoreboard": "lsb", "stalled_wait_per": "wt", "stalled_barrier": "bar",
            "stalled_lg_throttle": "lg", "lts__t_sector_hit_rate.pct": "l2", "smsp__inst_executed.sum": "inst",
            "smsp__issue_active.avg.pct": "issue", "hmma_cycles_active": "tc"}
    for line in file_lines(path):
        f = line.split()
        if not f:
            continue
        unit, last = (f[-2] if len(f) > 1 else ""), _num(f[-1])
        if "gpu__time_duration.sum" in line:
            v["t"] = last * scale.get(unit, 1.0)
        elif "local_op_ld.sum" in line:
            v["lmem"] = last * mb.get(unit, 1.0) if len(f) == 3 else last / 1e6
        elif "dram__bytes_read.sum" in line:
            v["dram"] = last * mb.get(unit, 1.0)
        for key, name in keys.items():
            if key in line:
                v[name] = last
    return v


def dropout_price_table(results: str) -> list:
    """Per kernel and d, p 0 against p 0.1: time, warp instructions, thread instructions per visible
    score (B H N^2 / 2 at N 4096, causal), issue slots, tensor and ALU pipes, local loads."""
    out = ["%-18s %4s %4s %10s %14s %14s %8s %8s %8s %12s" % ("kernel", "d", "p", "time_us", "warp_inst",
                                                              "inst_per_score", "issue%", "tensor%", "alu%", "local_ld_MB")]
    for k in ("stage07", "stage09"):
        for d in (64, 128):
            for p in ("0", "0.1"):
                path = os.path.join(results, f"ncu_{k}_dropout{p}_d{d}_metrics.txt")
                if not os.path.isfile(path):
                    continue
                v = ncu_values(path)
                scores = 4 * (2048 / d) * 4096 * 4096 / 2
                out.append("%-18s %4d %4s %10.0f %14.0f %14.1f %8.1f %8.1f %8.1f %12.0f" % (
                    k, d, p, v.get("t", 0), v.get("inst", 0), 32 * v.get("inst", 0) / scores, v.get("issue", 0),
                    v.get("tc", 0), v.get("alu", 0), v.get("lmem", 0)))
    return out


def gqa_price_table(results: str, stage: str, d: int, groups) -> list:
    """Per group (plain, 4, 8): time, warp instructions, issue and tensor %, local loads, the busiest
    SM's active cycles over the average one's, stalls, L2 hit rate, DRAM bytes read."""
    out = ["%-8s %10s %14s %8s %8s %12s %10s %8s %8s %8s %8s %8s %10s" % (
        "groups", "time_us", "warp_inst", "issue%", "tensor%", "local_ld_MB", "busiest/avg", "long_sb", "wait",
        "barrier", "lg_thr", "l2_hit%", "dram_MB")]
    for g in groups:
        path = os.path.join(results, f"ncu_stage{stage}_gqa{g}_d{d}_metrics.txt")
        if not os.path.isfile(path):
            continue
        v = ncu_values(path)
        ratio = v.get("cmax", 0) / v["cavg"] if v.get("cavg", 0) > 0 else 0
        out.append("%-8s %10.0f %14.0f %8.1f %8.1f %12.0f %10.2f %8.2f %8.2f %8.2f %8.2f %8.1f %10.0f" % (
            g, v.get("t", 0), v.get("inst", 0), v.get("issue", 0), v.get("tc", 0), v.get("lmem", 0), ratio,
            v.get("lsb", 0), v.get("wt", 0), v.get("bar", 0), v.get("lg", 0), v.get("l2", 0), v.get("dram", 0)))
    return out


def write_lines(path: str, lines) -> None:
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in lines))
