#!/usr/bin/env python3
"""Stage 11's road in Nsight Compute counters: one row per step, from `ncu --metrics` reports of
bench_gpu runs over every step (bench/gpu_session.sh ncu11road writes one report per head
dimension, every launch of hopper_forward_kernel profiled).

    ncu_steps11.py REPORT [REPORT ...]

A report holds, per profiled launch, a header line naming the kernel instance
(`hopper_forward_kernel<__nv_bfloat16, 128, StepN<9>>`, or `SmallBlocksN<11>` for step 11's small
blocks) and its counters; the first launch of
each (step, d) is kept. The step names come from bench_gpu's own line
(`stage 11   bf16; steps: 1 (wgmma) 2 (TMA ring) ...`). Columns: the kernel's time, the tensor
pipe's active cycles (`sm__pipe_tensor_op_hmma_cycles_active`: on sm_90 the pipe wgmma drives, the
counter keeps its mma.sync-era name), the special-function pipe (exp2), the FMA and ALU pipes, the
issue slots used, the global store requests and the 32-byte sectors they wrote, and the stall reasons,
in warps stalled per issued instruction (a warp waiting on wgmma_wait_group or a named barrier
counts as "wait"/"barrier", one waiting on an mbarrier's try_wait as "long scoreboard" or "sleeping").
"""
import re
import sys

KERNEL = re.compile(r"hopper_forward_kernel<(?:__nv_bfloat16|__half), (?:\(int\))?(\d+), [^<]*?(Timeline)?(?:StepN|SmallBlocksN)<(?:\(int\))?(\d+)>")
STEPS = re.compile(r"^stage 11 .*steps:(.*?); each", re.M)
STEP_NAME = re.compile(r"(\d+) \(([^)]*)\)")
ROW = re.compile(r"^\s*([a-z][a-z0-9_]*__[A-Za-z0-9_.]+)\s+(?:(\S+)\s+)?([0-9][0-9,]*(?:\.[0-9]+)?)\s*$")
TIME = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}

COLUMNS = [  # (title, counter, format)
    ("us", "gpu__time_duration.sum", "{:8.1f}"),
    ("tensor%", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "{:7.1f}"),
    ("xu%", "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active", "{:5.1f}"),
    ("fma%", "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active", "{:5.1f}"),
    ("alu%", "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active", "{:5.1f}"),
    ("issue%", "smsp__issue_active.avg.pct_of_peak_sustained_active", "{:6.1f}"),
    ("st.req", "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum", "{:8.0f}"),
    ("st.sect", "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum", "{:8.0f}"),
]
STALLS = ["wait", "long_scoreboard", "barrier", "sleeping", "math_pipe_throttle", "mio_throttle", "short_scoreboard",
          "dispatch_stall", "not_selected"]


def read(path, runs, names):
    """Adds {(d, step): {counter: value}} of one report to `runs` (the first launch of each) and the
    step names of its bench_gpu line to `names`."""
    text = open(path).read()
    for m in STEPS.finditer(text):
        names.update({int(k): v for k, v in STEP_NAME.findall(m.group(1))})
    key, values = None, None
    for line in text.splitlines():
        k = KERNEL.search(line)
        if k and not line.lstrip().startswith("==PROF=="):
            key = (int(k.group(1)), int(k.group(3)), bool(k.group(2)))
            values = runs.setdefault(key, {}) if key not in runs else None  # later launches are not kept
            continue
        m = ROW.match(line)
        if m and values is not None:
            name, unit, value = m.group(1), m.group(2) or "", float(m.group(3).replace(",", ""))
            values[name] = value * TIME.get(unit, 1.0) if name.startswith("gpu__time") else value


def main(argv):
    if not argv:
        sys.exit("usage: ncu_steps11.py REPORT [REPORT ...]")
    runs, names = {}, {}
    for path in argv:
        read(path, runs, names)
    if not runs:
        sys.exit("ncu_steps11.py: no hopper_forward_kernel launch in " + " ".join(argv))
    head = f"{'d':>4} {'step':>4} {'name':<18}" + "".join(f" {t:>{len(f.format(0))}}" for t, _, f in COLUMNS)
    head += "   stalls per issue: " + ", ".join(STALLS)
    print(head)
    print("-" * len(head))
    for (d, step, timeline) in sorted(runs):
        v = runs[(d, step, timeline)]
        cells = "".join(" " + (f.format(v[c]) if c in v else f"{'-':>{len(f.format(0))}}") for _, c, f in COLUMNS)
        stalls = []
        for s in STALLS:
            c = f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio"
            stalls.append(f"{v[c]:.2f}" if c in v else "-")
        name = names.get(step, "") + (" (instr.)" if timeline else "")
        print(f"{d:>4} {step:>4} {name:<18}{cells}   " + " ".join(f"{x:>5}" for x in stalls))


if __name__ == "__main__":
    main(sys.argv[1:])
