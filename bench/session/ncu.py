"""Nsight Compute in the session: the counters each report reads, one launch of a kernel under the
sections and then under the counters (ncu_command), each profile exported as a report kept in the
experiment's results folder (NAME.ncu-rep) and its raw page written from it as CSV (NAME.csv: one
row per profiled launch, one column per metric; bench/ncu_pages.py reads it), the regexes of
stage 09's kernel instances, bench_gpu's own lines dropped from a profiled run's output
(strip_bench), the summaries' lines and the tables of dropout's price and the grouped heads'
price, printed and written as CSV.

Why the reports and their raw pages, not the text ncu prints: a number read back from CSV by
its metric's name cannot be misread by a pattern over a layout that changes between versions,
and the report keeps everything for a look in Nsight Compute's window later (STYLE.md habit 16).
"""
from __future__ import annotations

import os
import re

import ncu_pages  # bench/ncu_pages.py: bench/ is on the path wherever the package `session` imports

from .experiment import Command, grep

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


# The sections of every report (ncu_command), by identifier; the raw page gives their metrics by raw name.
NCU_SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "MemoryWorkloadAnalysis", "MemoryWorkloadAnalysis_Tables",
                "ComputeWorkloadAnalysis", "WarpStateStats")


def profile(ncu_args, report: str, argv, ok=(0,)) -> Command:
    """One ncu run exporting REPORT.ncu-rep (an old one overwritten); what the program and ncu print
    goes to the experiment's log, bench_gpu's own lines dropped. ok: the exit codes that are not a
    failure."""
    return Command((*ncu_args, "--force-overwrite", "--export", report, *argv), filter=strip_bench, ok=ok)


def raw_page(report: str, log: str, kernel_base: str = "demangled", ok=(0,)) -> Command:
    """REPORT.ncu-rep's raw page as CSV into REPORT.csv: one row per profiled launch, every metric in
    its base unit (bench/ncu_pages.py reads it); ncu's own notices go to the log. kernel_base: how
    the "Kernel Name" column names a kernel (demangled, function or mangled)."""
    return Command(("ncu", "--import", f"{report}.ncu-rep", "--csv", "--page", "raw", "--print-units", "base",
                    "--print-kernel-base", kernel_base), stdout=f"{report}.csv", stderr=log, ok=ok)


def ncu_command(ctx, exp: str, kernel: str, name: str, metrics, argv, base="function") -> list:
    """One launch of the kernel (a regex) under Nsight Compute twice, each exported into the
    experiment's results folder with its raw page beside it: under the sections (NAME.ncu-rep,
    NAME.csv), then under the counters (NAME_metrics.ncu-rep, NAME_metrics.csv; a counter this ncu
    does not know is left out and named in the log). base "demangled" lets the regex name template
    arguments."""
    out, log = ctx.results(exp), ctx.log(exp)
    sections = ctx.known_sections(NCU_SECTIONS, log)
    head = ("timeout", "300", "ncu", "--clock-control", "none", "--kernel-name-base", base, "-k", f"regex:{kernel}",
            "--launch-count", "1")
    report, counters = os.path.join(out, name), os.path.join(out, f"{name}_metrics")
    return [profile((*head, *sections), report, argv), raw_page(report, log),
            profile((*head, "--metrics", ctx.known_metrics(metrics, log)), counters, argv), raw_page(counters, log)]


def report_outputs(*names) -> tuple:
    """The files ncu_command writes for each report name (a template such as ncu_stage07_d{d})."""
    return tuple(f"{n}{end}" for n in names for end in (".ncu-rep", ".csv", "_metrics.ncu-rep", "_metrics.csv"))


def ncu_one(ctx, exp: str, kernel: str, name: str, metrics, *args, base="function") -> list:
    """ncu_command on one bench_gpu run (one launch, no check) with args."""
    return ncu_command(ctx, exp, kernel, name, metrics, (ctx.exe("bench/bench_gpu"), *BENCH_NCU, *args), base)


# What a summary shows of a launch under the sections (the raw page names each metric by its raw
# name, not by the sections' labels): its time, the throughputs of compute and memory (Speed Of
# Light), achieved and theoretical occupancy, registers, dynamic shared memory, the occupancy
# limits, and the shared-memory bank conflicts of loads and stores (the memory tables).
SECTION_SUMMARY = (
    "gpu__time_duration.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__maximum_warps_per_active_cycle_pct",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_dynamic",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_warps",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
)
# A launch's shape beside another kernel's: registers, shared memory, achieved occupancy.
LAUNCH_SUMMARY = ("launch__registers_per_thread", "launch__shared_mem_per_block_dynamic",
                  "launch__shared_mem_per_block_static", "sm__warps_active.avg.pct_of_peak_sustained_active")


def _format(value) -> str:
    """A value as a summary line shows it: thousands separated, at most two decimals, or the text."""
    return f"{value:,.2f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)


def launches(path: str) -> list:
    """The launches of the raw page at path (bench/ncu_pages.py), none when the file is missing."""
    try:
        return ncu_pages.read_launches(path)
    except OSError:
        return []


def metric_lines(path: str, pick, kernels: bool = True) -> list:
    """Of each launch of the raw page at path (none when it is missing): its kernel and launch
    shape (kernels), then one line per metric pick selects (a tuple of names, in that order, or a
    regex searched in the name of each counter, the metrics every launch carries left out): name,
    unit, value."""
    out = []
    for launch in launches(path):
        if kernels:
            out.append("  " + launch.signature()[:160])
        names = pick if isinstance(pick, tuple) else sorted(n for n in launch.counters() if re.search(pick, n))
        out += [f"    {n:<72} {launch.metrics[n][1]:>14} {_format(launch.metrics[n][0])}" for n in names
                if n in launch.metrics]
    return out


def report_lines(results: str, name: str, sections=SECTION_SUMMARY, counters: str = ".") -> list:
    """Report NAME's launch with the metrics `sections` names (NAME.csv), then its counters whose
    names match the regex `counters` (NAME_metrics.csv)."""
    return metric_lines(os.path.join(results, f"{name}.csv"), sections) + \
        metric_lines(os.path.join(results, f"{name}_metrics.csv"), counters, kernels=False)


# What the Hopper kernels' summaries show of their counters: the tensor pipes (wgmma, mma.sync),
# exp2's pipe, registers and occupancy limits, spills, the main stall reasons.
NCU11_COUNTERS = r"gmma|hmma|pipe_xu|registers|occupancy_limit|local_op|stalled_(barrier|membar|long|short|mio|math|wait|sleeping)"


def labelled_reports(where, reports, counters: str) -> list:
    """Per (label, report name): the label line, then report_lines() of the report with the counters
    matching `counters`; last, the counters this ncu does not know (from the experiment's log)."""
    lines = []
    for label, name in reports:
        lines += [label] + report_lines(where.results, name, counters=counters)
    return lines + sorted(set(grep(where.log, "does not know")))


def launch_lines(results: str, *names: str) -> list:
    """Each report's first launch (kernel, grid, block) with its registers, shared memory and occupancy."""
    out = []
    for name in names:
        launch = ncu_pages.first_launch(os.path.join(results, f"{name}.csv"))
        out.append(f"-- {name}: " + (launch.signature()[:160] if launch else "no launch"))
        if launch:
            out += [f"    {n:<40} {launch.metrics[n][1]:>14} {_format(launch.metrics[n][0])}" for n in LAUNCH_SUMMARY
                    if n in launch.metrics]
    return out


def side_by_side(ctx, exp: str, head: str, table: str, cols) -> Command:
    """bench/ncu_side_by_side.py of the counters label=path into TABLE (.txt, headed by the GPU, the
    date and head) and its CSV beside it (.csv)."""
    path = os.path.join(ctx.results(exp), table)
    return Command(("python3", "bench/ncu_side_by_side.py", "--csv", os.path.splitext(path)[0] + ".csv", *cols),
                   stdout=path, header=(f"{ctx.gpu_name()}, {ctx.date()}: {head}",))


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
    Compute demangles it, atomic dQ (an unknown step: no shape)."""
    shape = _SHAPES09.get(f"{step}:{d}", _SHAPES09.get(str(step), ""))
    return rf"{KERNEL09_TILED}<[^,]*, \(int\){d}, {shape}.*{ATOMIC09}"


_STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
# The counters both price tables read, by their short key.
_PRICE_COUNTERS = {
    "inst": "smsp__inst_executed.sum", "issue": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "tc": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "alu": "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active", "cmax": "sm__cycles_active.max",
    "cavg": "sm__cycles_active.avg", "lsb": _STALL.format("long_scoreboard"), "wt": _STALL.format("wait"),
    "bar": _STALL.format("barrier"), "lg": _STALL.format("lg_throttle"), "l2": "lts__t_sector_hit_rate.pct",
}


def ncu_values(path: str) -> dict:
    """The counters both price tables read from a report's raw page (NAME_metrics.csv, its first
    launch): time (us), local loads and DRAM reads (MB), and the others by their short key; a
    counter the report lacks is absent."""
    launch = ncu_pages.first_launch(path)
    if launch is None:
        return {}
    v = {"t": launch.in_unit("gpu__time_duration.sum", "us"),
         "lmem": launch.in_unit("l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum", "MB"),
         "dram": launch.in_unit("dram__bytes_read.sum", "MB")}
    v.update({key: launch.value(metric) for key, metric in _PRICE_COUNTERS.items()})
    return {k: x for k, x in v.items() if x is not None}


# (CSV column, printed title, format) of each price table.
DROPOUT_COLUMNS = (
    ("kernel", "kernel", "%-18s"), ("d", "d", "%4d"), ("p", "p", "%4s"), ("time_us", "time_us", "%10.0f"),
    ("warp_inst", "warp_inst", "%14.0f"), ("inst_per_score", "inst_per_score", "%14.1f"),
    ("issue_pct", "issue%", "%8.1f"), ("tensor_pct", "tensor%", "%8.1f"), ("alu_pct", "alu%", "%8.1f"),
    ("local_ld_MB", "local_ld_MB", "%12.0f"))
GQA_COLUMNS = (
    ("groups", "groups", "%-8s"), ("time_us", "time_us", "%10.0f"), ("warp_inst", "warp_inst", "%14.0f"),
    ("issue_pct", "issue%", "%8.1f"), ("tensor_pct", "tensor%", "%8.1f"), ("local_ld_MB", "local_ld_MB", "%12.0f"),
    ("busiest_over_avg", "busiest/avg", "%10.2f"), ("stall_long_scoreboard", "long_sb", "%8.2f"),
    ("stall_wait", "wait", "%8.2f"), ("stall_barrier", "barrier", "%8.2f"), ("stall_lg_throttle", "lg_thr", "%8.2f"),
    ("l2_hit_pct", "l2_hit%", "%8.1f"), ("dram_MB", "dram_MB", "%10.0f"))


def table_lines(columns, rows) -> list:
    """A price table as printed: the titles, then each row (a counter a report lacks prints as 0)."""
    heads = " ".join((fmt.split(".")[0].rstrip("dfs") + "s") % title for _, title, fmt in columns)
    return [heads] + [" ".join(fmt % (0 if c is None else c) for (_, _, fmt), c in zip(columns, r)) for r in rows]


def write_table(path: str, columns, rows) -> None:
    """A price table's rows as CSV (PATH), a counter a report lacks left empty."""
    ncu_pages.write_csv(path, [c for c, _, _ in columns], rows)


def dropout_price(results: str) -> list:
    """Rows of DROPOUT_COLUMNS: per kernel and d, p 0 against p 0.1: time, warp instructions, thread
    instructions per visible score (B H N^2 / 2 at N 4096, causal), issue slots, tensor and ALU
    pipes, local loads."""
    rows = []
    for k in ("stage07", "stage09"):
        for d in (64, 128):
            for p in ("0", "0.1"):
                path = os.path.join(results, f"ncu_{k}_dropout{p}_d{d}_metrics.csv")
                if not os.path.isfile(path):
                    continue
                v = ncu_values(path)
                scores = 4 * (2048 / d) * 4096 * 4096 / 2
                per_score = 32 * v["inst"] / scores if "inst" in v else None
                rows.append((k, d, p, v.get("t"), v.get("inst"), per_score, v.get("issue"), v.get("tc"), v.get("alu"),
                             v.get("lmem")))
    return rows


def dropout_price_table(results: str) -> list:
    """The table of dropout_price() as printed."""
    return table_lines(DROPOUT_COLUMNS, dropout_price(results))


def gqa_price(results: str, stage: str, d: int, groups) -> list:
    """Rows of GQA_COLUMNS: per group (plain, 4, 8): time, warp instructions, issue and tensor %,
    local loads, the busiest SM's active cycles over the average one's, stalls, L2 hit rate, DRAM
    bytes read."""
    rows = []
    for g in groups:
        path = os.path.join(results, f"ncu_stage{stage}_gqa{g}_d{d}_metrics.csv")
        if not os.path.isfile(path):
            continue
        v = ncu_values(path)
        ratio = v["cmax"] / v["cavg"] if v.get("cavg", 0) > 0 and "cmax" in v else None
        rows.append((g, v.get("t"), v.get("inst"), v.get("issue"), v.get("tc"), v.get("lmem"), ratio, v.get("lsb"),
                     v.get("wt"), v.get("bar"), v.get("lg"), v.get("l2"), v.get("dram")))
    return rows


def gqa_price_table(results: str, stage: str, d: int, groups) -> list:
    """The table of gqa_price() as printed."""
    return table_lines(GQA_COLUMNS, gqa_price(results, stage, d, groups))


def write_lines(path: str, lines) -> None:
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in lines))
