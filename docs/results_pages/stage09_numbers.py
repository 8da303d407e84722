"""The numbers stage 09's lesson and record page quote in their prose, as Doxygen aliases
(\\s09_*): its road's ratios step by step (bench/sdpa_compare.py's tables of each run, read by
tables.read_stage09_steps), its default main kernel on the grid (the runs' stage09_pair tables and
ratios over rounds), its shared-memory bound against the mma.sync ceiling, and Nsight Compute's
counters of its kernels. Each is a span over both dtypes, both sizes, causal and not, unless its
name says otherwise; "–" without data."""

import os
from collections import OrderedDict

from .formatting import span_ratios
from .ncu_csv import read_ncu_metrics
from .stage09 import STAGE09_DEFAULT_GRID_RECORDS
from .tables import beside, read_ratios, read_stage09_pairs

# FLOPs per byte read from shared memory of stage 09's main kernels, as its lesson counts them from
# their ldmatrix.x4 (512 bytes) and mma (4096 FLOPs) per pair of blocks: the first kernel (step 0,
# "where the time goes", question 3) and the warp-tiled one of step 1 at d = 64. An SM's shared
# memory delivers 128 bytes per clock.
STAGE09_FLOPS_PER_SMEM_BYTE = {"step0": 12.8, "step1": 16.0}
SMEM_BYTES_PER_CLOCK = 128

# Counters of one kernel's report: (alias key, counter, format).
TENSOR = ("tensor", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "{:.1f}%")
MIO = ("mio", "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio", "{:.2f}")
FIRST_COUNTERS = (TENSOR, ("barrier", "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio", "{:.2f}"), MIO)
LATER_COUNTERS = (("ms", "Duration", "{:.2f}"), TENSOR, MIO,
                  ("wait", "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio", "{:.2f}"),
                  ("short", "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio", "{:.2f}"),
                  ("regs", "Registers Per Thread", "{:.0f}"))

# The counters stage 09's lesson sets beside each other for the kernels of one Nsight Compute run:
# (alias key, counter, format, scale). Time in ms, bytes in MB, instruction counts in millions.
NCU09_SIDE_COUNTERS = (
    ("ms", "gpu__time_duration.sum", "{:.2f}", None),
    ("regs", "Registers Per Thread", "{:.0f}", 1.0),
    ("local_mb", "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum", "{:.0f}", None),
    ("inst_m", "smsp__inst_executed.sum", "{:.0f}", 1e-6),
    ("ldsm_m", "smsp__sass_inst_executed_op_ldsm.sum", "{:.0f}", 1e-6),
    ("lds_m", "smsp__sass_inst_executed_op_shared_ld.sum", "{:.1f}", 1e-6),
    ("conflicts_m", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum", "{:.2f}", 1e-6),
    ("tensor", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "{:.1f}%", 1.0),
    ("issue", "smsp__issue_active.avg.pct_of_peak_sustained_active", "{:.1f}%", 1.0),
    ("alu", "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active", "{:.1f}%", 1.0),
    ("barrier", "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio", "{:.2f}", 1.0),
    ("short", "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio", "{:.2f}", 1.0),
    ("wait", "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio", "{:.2f}", 1.0),
    ("mio", "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio", "{:.2f}", 1.0),
    ("lg", "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio", "{:.2f}", 1.0),
    ("long", "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio", "{:.2f}", 1.0),
    ("red_m", "smsp__inst_executed_op_global_red.sum", "{:.1f}", 1e-6),
    ("red_sectors_m", "l1tex__t_sectors_pipe_lsu_mem_global_op_red.sum", "{:.0f}", 1e-6),
)

# What ncu may print a counter in, to the unit NCU09_SIDE_COUNTERS gives it (None: a scale by unit).
NCU_UNIT_SCALE = {"ms": {"ms": 1.0, "msecond": 1.0, "us": 1e-3, "usecond": 1e-3, "ns": 1e-6, "nsecond": 1e-6, "s": 1e3},
                  "local_mb": {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3}}


def counter_aliases(metrics, prefix, counters):
    """\\<prefix>_<key> for each (key, counter, format) of `counters` in `metrics` (a report as
    read_ncu_metrics() reads it)."""
    return OrderedDict((f"{prefix}_{key}", fmt.format(metrics[metric][0]) if metric in metrics else "–")
                       for key, metric, fmt in counters)


def road_numbers(ceilings, road09, results_dir):
    """Its shared-memory bound set against the mma.sync ceiling (ceilings: the lines of
    mma_ceiling.jsonl by name), its road's ratios (road09: stage09_steps_quick.json, steps 1 to 3
    beside step 0), and Nsight Compute's counters of step 0 beside step 1 at d = 64
    (ncu_stage09_d64_metrics.csv, ncu_stage09_tiled_d64_metrics.csv)."""
    aliases = OrderedDict()
    for step, name in (("step0", "ncu_stage09_d64_metrics.csv"), ("step1", "ncu_stage09_tiled_d64_metrics.csv")):
        aliases.update(counter_aliases(read_ncu_metrics(results_dir, name), f"s09_ncu_{step}_d64", FIRST_COUNTERS))
    try:
        per_clock = float(ceilings["mma_bf16"]["per_sm_per_clock"])
        sms, mhz = float(ceilings["mma_bf16"]["sm_count"]), float(ceilings["mma_bf16"]["sm_clock_mhz"])
    except (KeyError, TypeError, ValueError):
        per_clock = sms = mhz = None
    for step, ratio in STAGE09_FLOPS_PER_SMEM_BYTE.items():
        feed = ratio * SMEM_BYTES_PER_CLOCK  # FLOPs per clock and SM shared memory can feed
        aliases[f"s09_smem_share_{step}"] = f"{100 * feed / per_clock:.0f}%" if per_clock else "–"
        aliases[f"s09_smem_tflops_{step}"] = f"{feed * sms * mhz * 1e6 * 1e-12:.0f}" if per_clock else "–"

    rows = {(r["step"], r["dtype"], r["d"], r["N"], r["causal"]): r for r in (road09 or {}).get("rows", [])}

    def points(step, d=None):
        return [r for k, r in rows.items() if k[0] == step and (d is None or k[2] == d)]

    def over(a, b, d, key="bwd"):
        """Step a's TFLOP/s over step b's at the same point."""
        out = []
        for r in points(a, d):
            base = rows.get((b, r["dtype"], r["d"], r["N"], r["causal"]))
            if base and r[key] and base[key]:
                out.append(r[key] / base[key])
        return out

    for a, b in ((1, 0), (2, 0), (3, 2)):
        for d in (64, 128):
            aliases[f"s09_road_s{a}_over_s{b}_d{d}"] = span_ratios(over(a, b, d))
    for d in (64, 128):
        aliases[f"s09_road_s2_fb_flash_d{d}"] = span_ratios(r["fb_vs_flash"] for r in points(2, d))
    fb = [r["fb_vs_flash"] for r in points(2) if r["fb_vs_flash"] is not None]
    below = [x for x in fb if x < 1.0]
    if not fb:
        aliases["s09_road_s2_fb_target"] = "–"
    elif below:
        aliases["s09_road_s2_fb_target"] = (f"The target of 1.0 at every shape is not met yet: {len(below)} of these "
                                            f"{len(fb)} points are below it, by up to {100 * (1 - min(below)):.0f}%.")
    else:
        aliases["s09_road_s2_fb_target"] = f"All {len(fb)} points meet the target of 1.0."
    # Against cuDNN's pair: the record times cuDNN beside the default main kernel's rows only.
    default = (road09 or {}).get("default_step")
    cudnn = []
    for r in points(2):
        base = rows.get((default, r["dtype"], r["d"], r["N"], r["causal"]))
        if base and r["fb"] and base.get("fb_cudnn_tflops"):
            cudnn.append(r["fb"] / base["fb_cudnn_tflops"])
    aliases["s09_road_s2_fb_cudnn"] = span_ratios(cudnn)
    for step in (0, 2):
        aliases[f"s09_road_s{step}_det"] = span_ratios(r["det_vs_atomic"] for r in points(step))
    return aliases


def grid_numbers(results_dir, name, prefix):
    """Stage 09's default main kernel on the grid's other sizes (N 512, 1024, 2048 and 8192), from
    the ratios over rounds of one run (`name`: the printed record, read from its tables file beside
    it): forward + backward and the backward alone over SDPA flash's, each a span over bf16 and fp16,
    causal and not, \\<prefix>_fb_flash_d64_n512 and \\<prefix>_bwd_flash_d64_n512 (every d and N
    likewise); over cuDNN's pair, \\<prefix>_fb_cudnn_d64; the run's GPU and date, \\<prefix>_gpu and
    \\<prefix>_date."""
    grid, meta = read_ratios(os.path.join(results_dir, beside(name)))
    median = lambda point, key: point[key][0] if point.get(key) else None
    aliases = OrderedDict()
    for d in (64, 128):
        for n in (512, 1024, 2048, 8192):
            vals = [v for k, v in grid.items() if k[1] == d and k[2] == n]
            aliases[f"{prefix}_fb_flash_d{d}_n{n}"] = span_ratios(median(v, "stage09/sdpa_flash/fwd+bwd") for v in vals)
            aliases[f"{prefix}_bwd_flash_d{d}_n{n}"] = span_ratios(median(v, "stage09/sdpa_flash/backward") for v in vals)
        aliases[f"{prefix}_fb_cudnn_d{d}"] = span_ratios(median(v, "stage09/sdpa_cudnn/fwd+bwd")
                                                         for k, v in grid.items() if k[1] == d)
    aliases[f"{prefix}_gpu"], aliases[f"{prefix}_date"] = meta.get("gpu", "–"), meta.get("date", "–")
    return aliases


def default_grid_numbers(results_dir):
    """The figures of the stage 09 lesson's sweep section (STAGE09_DEFAULT_GRID_RECORDS' pair
    tables): forward + backward over SDPA flash's pair, \\s09_sweep_fb_flash, and over cuDNN's,
    \\s09_sweep_fb_cudnn; the backward alone over flash's, \\s09_sweep_bwd_flash; the deterministic
    backward's time over the atomic one, \\s09_sweep_det; the sizes they cover, \\s09_sweep_sizes, and
    the records' GPU and dates, \\s09_sweep_gpu and \\s09_sweep_date."""
    points, gpus, dates = read_stage09_pairs([os.path.join(results_dir, beside(n)) for n in STAGE09_DEFAULT_GRID_RECORDS])
    aliases = OrderedDict()
    for alias, key in (("s09_sweep_fb_flash", "fb_vs_flash"), ("s09_sweep_fb_cudnn", "fb_vs_cudnn"),
                       ("s09_sweep_bwd_flash", "bwd_vs_flash"), ("s09_sweep_det", "det_vs_atomic")):
        aliases[alias] = span_ratios(v[key] for v in points.values())
    sizes = sorted({k[2] for k in points})
    aliases["s09_sweep_sizes"] = ", ".join(str(n) for n in sizes) if sizes else "–"
    aliases["s09_sweep_gpu"] = ", ".join(gpus) or "–"
    aliases["s09_sweep_date"] = ", ".join(dates) or "–"
    return aliases


def later_numbers(road09_later, results_dir):
    """Stage 09's later steps (4 and 5): their record (road09_later: stage09_steps4_quick.json,
    steps 4 and 5 beside step 2 in one run); the default main kernel of then (step 4) on the rest
    of the grid (stage09_grid_step4_ratios_over_rounds: \\s09_grid_*); and Nsight Compute's counters
    of steps 2, 4 and 5 at d = 64 (ncu_stage09_step<s>_d64.csv and _metrics.csv)."""
    aliases = OrderedDict()
    rows = {(r["step"], r["dtype"], r["d"], r["N"], r["causal"]): r for r in (road09_later or {}).get("rows", [])}

    def over(a, b, d):
        out = []
        for k, r in rows.items():
            base = rows.get((b,) + k[1:])
            if k[0] == a and k[2] == d and base and r["bwd"] and base["bwd"]:
                out.append(r["bwd"] / base["bwd"])
        return out

    for a, b in ((4, 2), (5, 4)):
        aliases[f"s09_road4_s{a}_over_s{b}_d64"] = span_ratios(over(a, b, 64))
    for step in (2, 4):
        for d in (64, 128):
            pts = [r for k, r in rows.items() if k[0] == step and k[2] == d]
            aliases[f"s09_road4_s{step}_fb_flash_d{d}"] = span_ratios(r["fb_vs_flash"] for r in pts)
            aliases[f"s09_road4_s{step}_bwd_flash_d{d}"] = span_ratios(r["bwd_vs_flash"] for r in pts)
    pts = [r for k, r in rows.items() if k[0] == 4]
    aliases["s09_road4_s4_det"] = span_ratios(r["det_vs_atomic"] for r in pts)
    fb = [r["fb_vs_flash"] for r in pts if r["fb_vs_flash"] is not None]
    below = [x for x in fb if round(x, 2) < 1.0]
    aliases["s09_road4_s4_fb_below"] = f"{len(below)} of {len(fb)}" if fb else "–"
    # The default main kernel (step 4) on the rest of the grid, N 512, 1024, 2048 and 8192, in a run
    # of its own (medians over three rounds).
    aliases.update(grid_numbers(results_dir, "stage09_grid_step4_ratios_over_rounds.txt", "s09_grid"))
    for step in (2, 4, 5):
        metrics = read_ncu_metrics(results_dir, f"ncu_stage09_step{step}_d64.csv", f"ncu_stage09_step{step}_d64_metrics.csv")
        aliases.update(counter_aliases(metrics, f"s09_ncu_step{step}_d64", LATER_COUNTERS))
        # Per warp and query block: bench_gpu's problem at d = 64, N = 4096 non-causal (B 4, H 32) runs
        # 4096 blocks of 8 warps, each over 32 query blocks.
        warp_blocks = 4096 * 8 * 32
        for key, metric in (("ldsm", "smsp__sass_inst_executed_op_ldsm.sum"),
                            ("wf_ld", "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"),
                            ("wf_st", "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum")):
            aliases[f"s09_ncu_step{step}_d64_{key}"] = f"{metrics[metric][0] / warp_blocks:.0f}" if metric in metrics else "–"
    return aliases


def ncu09_side_numbers(results_dir, prefix, reports):
    """Aliases \\<prefix>_<label>_<key> for each (label, report name) of `reports` (an Nsight
    Compute report of docs/results/: its sections `name`.csv and its counters `name`_metrics.csv)
    and each counter of NCU09_SIDE_COUNTERS; '–' where a report or a counter is missing."""
    aliases = OrderedDict()
    for label, name in reports:
        metrics = read_ncu_metrics(results_dir, name + ".csv", name + "_metrics.csv")  # sections (registers), counters
        for key, counter, fmt, scale in NCU09_SIDE_COUNTERS:
            value = None
            if counter in metrics:
                v, unit = metrics[counter]
                factor = scale if scale is not None else NCU_UNIT_SCALE[key].get(unit)
                value = None if factor is None else v * factor
            aliases[f"{prefix}_{label}_{key}"] = fmt.format(value) if value is not None else "–"
    return aliases


def over_default_numbers(record, step, prefix, over="over_default"):
    """One step's backward (and forward + backward) over the default main kernel it was timed beside
    (record: read_stage09_steps()), per head dimension: \\<prefix>_<over>_d64, \\<prefix>_fb_<over>_d64
    (d 128 likewise), and at how many points its backward was slower, \\<prefix>_slower ("3 of 16")."""
    aliases = OrderedDict()
    rows = [r for r in (record or {}).get("rows", []) if r["step"] == step]
    for d in (64, 128):
        aliases[f"{prefix}_{over}_d{d}"] = span_ratios(r["bwd_vs_default"] for r in rows if r["d"] == d)
        aliases[f"{prefix}_fb_{over}_d{d}"] = span_ratios(r["fb_vs_default"] for r in rows if r["d"] == d)
    slower = [r for r in rows if r["bwd_vs_default"] is not None and round(r["bwd_vs_default"], 2) < 1.0]
    aliases[f"{prefix}_slower"] = f"{len(slower)} of {len(rows)}" if rows else "–"
    return aliases


def fresh_numbers(road09_fresh, results_dir):
    """Step 6 and the comparison with SDPA flash's kernel: step 6's backward over step 4's, from
    their run side by side (road09_fresh: stage09_steps6_quick.json); Nsight Compute's counters of
    step 4 beside step 6 (ncu_stage09_step6.csv's reports) and of step 4 beside SDPA flash's backward
    kernel (ncu_flash09.csv's)."""
    aliases = over_default_numbers(road09_fresh, 6, "s09_road6_s6", "over_s4")
    aliases.update(ncu09_side_numbers(results_dir, "s09_fresh", [
        ("s4_d64", "ncu_stage09_step4_beside6_d64"), ("s6_d64", "ncu_stage09_step6_d64"),
        ("s4_d128", "ncu_stage09_step4_beside6_d128"), ("s6_d128", "ncu_stage09_step6_d128")]))
    aliases.update(ncu09_side_numbers(results_dir, "s09_fa2", [
        ("ours_d64", "ncu_stage09_ours_d64"), ("flash_d64", "ncu_flash_bwd_d64"),
        ("ours_d128", "ncu_stage09_ours_d128"), ("flash_d128", "ncu_flash_bwd_d128")]))
    return aliases


def tiles_numbers(road09_tiles, results_dir):
    """Steps 9 and 10 (the dQ accumulator in tiles): their record (road09_tiles:
    stage09_steps910_quick.json, steps 9 and 10 beside step 4, the default of then, in one run),
    each over step 4 (over_default_numbers) and over SDPA flash, \\s09_road910_s9_bwd_flash_d64 and
    _fb_flash_d64 (d 128 likewise), and the deterministic mode's time over the atomic one,
    \\s09_road910_s9_det; step 9, the default since, on the grid's other sizes
    (stage09_grid_step9_ratios_over_rounds: \\s09_grid9_*) and in the lesson's sweep section
    (\\s09_sweep_*); Nsight Compute's counters of step 4 beside step 9 (ncu_stage09_step4_beside9_d64
    and ncu_stage09_step9_d64, d 128 likewise: \\s09_tiles_s4_d64_lg and the like)."""
    aliases = OrderedDict()
    for step in (9, 10):
        prefix = f"s09_road910_s{step}"
        aliases.update(over_default_numbers(road09_tiles, step, prefix))
        rows = [r for r in (road09_tiles or {}).get("rows", []) if r["step"] == step]
        for d in (64, 128):
            aliases[f"{prefix}_bwd_flash_d{d}"] = span_ratios(r["bwd_vs_flash"] for r in rows if r["d"] == d)
            aliases[f"{prefix}_fb_flash_d{d}"] = span_ratios(r["fb_vs_flash"] for r in rows if r["d"] == d)
        aliases[f"{prefix}_det"] = span_ratios(r["det_vs_atomic"] for r in rows)
    aliases.update(grid_numbers(results_dir, "stage09_grid_step9_ratios_over_rounds.txt", "s09_grid9"))
    aliases.update(default_grid_numbers(results_dir))
    aliases.update(ncu09_side_numbers(results_dir, "s09_tiles", [
        ("s4_d64", "ncu_stage09_step4_beside9_d64"), ("s9_d64", "ncu_stage09_step9_d64"),
        ("s4_d128", "ncu_stage09_step4_beside9_d128"), ("s9_d128", "ncu_stage09_step9_d128")]))
    return aliases


def aliases(ceilings, roads, results_dir):
    """Every \\s09_* alias, from `roads` (stage09.read_roads()) and the records of results_dir."""
    out = road_numbers(ceilings, roads["stage09_steps_quick.txt"], results_dir)
    out.update(later_numbers(roads["stage09_steps4_quick.txt"], results_dir))
    out.update(fresh_numbers(roads["stage09_steps6_quick.txt"], results_dir))
    for step in (7, 8):
        out.update(over_default_numbers(roads["stage09_steps78_quick.txt"], step, f"s09_road78_s{step}"))
    out.update(tiles_numbers(roads["stage09_steps910_quick.txt"], results_dir))
    return out
