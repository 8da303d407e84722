#!/usr/bin/env python3
"""Stage 11's road in Nsight Compute counters: one row per step, from the raw pages of `ncu
--metrics` reports of bench_gpu runs over every step (bench/session.py ncu11road writes one
report per head dimension, every launch of hopper_forward_kernel profiled, NAME.csv beside it).

    ncu_steps11.py [--csv TABLE.csv] [--names BENCH.csv ...] REPORT.csv [REPORT.csv ...]

A page holds one row per profiled launch, its "Kernel Name" the kernel instance
(`hopper_forward_kernel<__nv_bfloat16, (int)128, ...StepN<(int)9>>`, or `SmallBlocksN<11>` for
step 11's small blocks); the first launch of each (step, d) is kept. The step names come from
bench_gpu's own CSV of the profiled runs (--names: its columns step and step_name). Columns: the
kernel's time, the tensor pipe's active cycles (`sm__pipe_tensor_op_hmma_cycles_active`: on
sm_90 the pipe wgmma drives, the counter keeps its mma.sync-era name), the special-function pipe
(exp2), the FMA and ALU pipes, the issue slots used, the global store requests and the 32-byte
sectors they wrote, and the stall reasons, in warps stalled per issued instruction (a warp
waiting on wgmma_wait_group or a named barrier counts as "wait"/"barrier", one waiting on an
mbarrier's try_wait as "long scoreboard" or "sleeping"). --csv writes the table also as CSV: d,
step, name, instrumented (1: the Timeline build), then one column per counter (us: the time in
microseconds) and per stall reason (stall_wait, ...).
"""
import argparse
import csv
import os
import re
import sys

import ncu_pages

KERNEL = re.compile(r"hopper_forward_kernel<(?:__nv_bfloat16|__half), (?:\(int\))?(\d+), [^<]*?(Timeline)?"
                    r"(?:StepN|SmallBlocksN)<(?:\(int\))?(\d+)>")
TIME = "gpu__time_duration.sum"

COLUMNS = [  # (title, CSV column, counter, format)
    ("us", "us", TIME, "{:8.1f}"),
    ("tensor%", "tensor_pct", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "{:7.1f}"),
    ("xu%", "xu_pct", "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active", "{:5.1f}"),
    ("fma%", "fma_pct", "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active", "{:5.1f}"),
    ("alu%", "alu_pct", "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active", "{:5.1f}"),
    ("issue%", "issue_pct", "smsp__issue_active.avg.pct_of_peak_sustained_active", "{:6.1f}"),
    ("st.req", "st_req", "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum", "{:8.0f}"),
    ("st.sect", "st_sect", "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum", "{:8.0f}"),
]
STALLS = ["wait", "long_scoreboard", "barrier", "sleeping", "math_pipe_throttle", "mio_throttle", "short_scoreboard",
          "dispatch_stall", "not_selected"]


def stall(reason):
    return f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"


def read(path, runs):
    """Adds {(d, step, instrumented): {counter: value}} of one raw page to `runs`, the first launch
    of each; the time in microseconds."""
    for launch in ncu_pages.read_launches(path):
        k = KERNEL.search(launch.kernel)
        if not k:
            continue
        key = (int(k.group(1)), int(k.group(3)), bool(k.group(2)))
        if key in runs:
            continue  # later launches are not kept
        values = {name: v for name, (v, _) in launch.counters().items()}
        if TIME in values:
            values[TIME] = launch.in_unit(TIME, "us")
        runs[key] = values


def read_names(path, names):
    """Adds {step: name} of stage 11's rows of a bench_gpu CSV (impl stage11...) to `names`; a
    missing file (bench_gpu failed under the profiler) leaves the names empty."""
    if not os.path.isfile(path):
        print(f"ncu_steps11.py: no {path}: steps without names", file=sys.stderr)
        return
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("impl", "").startswith("stage11") and row.get("step", "").isdigit():
                names[int(row["step"])] = row.get("step_name", "")


def rows(runs, names):
    """One row per (d, step, instrumented), sorted: d, step, name, instrumented, then the counters
    of COLUMNS and the stalls (None where a page lacks one)."""
    out = []
    for d, step, timeline in sorted(runs):
        v = runs[(d, step, timeline)]
        out.append([d, step, names.get(step, ""), int(timeline)] + [v.get(c) for _, _, c, _ in COLUMNS]
                   + [v.get(stall(s)) for s in STALLS])
    return out


def main(argv):
    ap = argparse.ArgumentParser(description="stage 11's road in Nsight Compute counters, one row per step")
    ap.add_argument("--csv", help="write the table also as CSV")
    ap.add_argument("--names", action="append", default=[], help="bench_gpu's CSV of the profiled runs (step names)")
    ap.add_argument("reports", nargs="+", help="raw pages of the reports (ncu --import R --csv --page raw)")
    args = ap.parse_args(argv)
    runs, names = {}, {}
    for path in args.reports:
        read(path, runs)
    for path in args.names:
        read_names(path, names)
    if not runs:
        sys.exit("ncu_steps11.py: no hopper_forward_kernel launch in " + " ".join(args.reports))
    table = rows(runs, names)
    head = f"{'d':>4} {'step':>4} {'name':<18}" + "".join(f" {t:>{len(f.format(0))}}" for t, _, _, f in COLUMNS)
    head += "   stalls per issue: " + ", ".join(STALLS)
    print(head)
    print("-" * len(head))
    for d, step, name, timeline, *values in table:
        cells = "".join(" " + (f.format(x) if x is not None else f"{'-':>{len(f.format(0))}}")
                        for (_, _, _, f), x in zip(COLUMNS, values))
        stalls = [f"{x:.2f}" if x is not None else "-" for x in values[len(COLUMNS):]]
        name += " (instr.)" if timeline else ""
        print(f"{d:>4} {step:>4} {name:<18}{cells}   " + " ".join(f"{x:>5}" for x in stalls))
    if args.csv:
        ncu_pages.write_csv(args.csv, ["d", "step", "name", "instrumented"] + [c for _, c, _, _ in COLUMNS]
                            + [f"stall_{s}" for s in STALLS], table)


if __name__ == "__main__":
    main(sys.argv[1:])
