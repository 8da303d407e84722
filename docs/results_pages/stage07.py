"""Stage 07 (tensor cores, bf16 and fp16) on the results page and in its lesson: its section beside
SDPA flash and cuDNN (gpu_sweep.csv), its ratios, its road (road.csv); the lesson's bridge table
from stages 05/06 to its first and final kernels (stage07_bridge_table.txt); and the numbers its
lesson quotes (\\s07_*: each step's gain, the ratios to SDPA, Nsight Compute's counters)."""

import os
from collections import OrderedDict

from . import plots
from .ceilings import ceilings_table
from .formatting import HALF_DTYPES, count_words, fmt_num, impl_name, md, span
from .ncu_csv import read_ncu_parts
from .page import gpu_sections, ratios_by_shape, road_dtype, road_tables, show_plot, side_by_side, tflops_table
from .readers import mma_ceiling

# Stage 07 beside the SDPA backends that run in 16 bits: one colour per implementation, one line
# style per dtype.
STAGE07_IMPLS = ["stage07", "sdpa_flash", "sdpa_cudnn"]


def plot_stage07(group_rows, ceiling, title, path):
    """Stage 07 and SDPA flash / cuDNN, bf16 solid and fp16 dashed, the mma.sync ceiling dotted."""
    fig, ax = plots.plt.subplots(figsize=(8.2, 4.2), dpi=110)
    for i, impl in enumerate(STAGE07_IMPLS):
        for dtype in HALF_DTYPES:
            pts = sorted((r["N"], r["tflops"]) for r in group_rows if r["impl"] == impl and r["dtype"] == dtype)
            if not pts:
                continue
            ours = impl.startswith("stage")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=f"C{i}", marker="o" if ours else "s",
                    linestyle="-" if dtype == "bf16" else "--", linewidth=2.2 if ours else 1.4, markersize=5,
                    label=f"{impl_name(impl)} {dtype}")
    if ceiling:
        ax.axhline(ceiling, color="0.5", linestyle=":", linewidth=1.2, label="mma.sync bf16 ceiling")
    plots.finish_tflops_against_n(fig, ax, title, path)


def section(rows, meta, road, images, out, plots_made):
    """Stage 07 in bf16 and fp16 beside SDPA flash and cuDNN in the same dtypes; the ratios; the road."""
    w = out.append
    w("## GPU: stage 07 on the tensor cores beside SDPA flash and cuDNN {#results_stage07}")
    w("")
    ours = [r for r in rows or [] if r["impl"] == "stage07" and r["dtype"] in HALF_DTYPES]
    ceiling = mma_ceiling(meta)
    if not ours:
        w("\\note The stage 07 figures have not been measured yet: `docs/results/gpu_sweep.csv` has no stage 07 "
          "rows. `python3 bench/session.py run sweep07` measures them in bf16 and fp16 beside SDPA's flash and cuDNN "
          "backends, and `python3 bench/session.py run road` measures each step of its road.")
        w("")
    else:
        dtypes, side, gpus = side_by_side(rows, ours, STAGE07_IMPLS)
        w(f"Stage 07 runs in bf16 and fp16 (float32 accumulation) on the tensor cores; SDPA's flash and cuDNN "
          f"backends ran on the same shapes in the same dtypes, in the same sweep. Measured on **{md(', '.join(gpus))}**, "
          f"SM clock {span((r['sm_clock_mhz'] for r in side), 'MHz')}, {span(r['date'] for r in side)}.")
        w("")
        ceilings_table(meta, out)
        for gpu, d, mask, anchor, g in gpu_sections(side, "results_stage07", gpus, w):
            show_plot(lambda path: plot_stage07(g, ceiling, f"{gpu}: stage 07 and SDPA, d = {d}, {mask}", path),
                      f"{anchor}.png", f"TFLOP/s against N, bf16 and fp16, d = {d}, {mask}", images, plots_made, w)
            tflops_table(g, dtypes, STAGE07_IMPLS, w)
        ratios_section(side, dtypes, meta, out)
    road_section(road, images, out, plots_made)


def ratios_section(side, dtypes, meta, out):
    """Per dtype: stage 07 / SDPA flash and / cuDNN at every shape, and the fraction of the ceiling."""
    w = out.append
    w("### Stage 07 against SDPA {#results_stage07_ratios}")
    w("")
    idx = {(r["gpu"], r["impl"], r["dtype"], r["N"], r["d"], r["causal"]): r for r in side}
    for t in dtypes:
        ceiling = mma_ceiling(meta, t)

        def cell(gpu, n, d, causal):
            r = idx.get((gpu, "stage07", t, n, d, causal))
            fl, cu = idx.get((gpu, "sdpa_flash", t, n, d, causal)), idx.get((gpu, "sdpa_cudnn", t, n, d, causal))
            if not r:
                return "–"
            text = f"{fmt_num(r['tflops'] / fl['tflops'])}×" if fl else "–"
            low = fl is not None and r["tflops"] < fl["tflops"]
            text = f"**{text}**" if low else text  # below the target (1.0x flash): in bold
            text += f" ({fmt_num(r['tflops'] / cu['tflops'])}×)" if cu else ""
            return text + (f"<br>{100 * r['tflops'] / ceiling:.0f}%" if ceiling else "")

        ratios_by_shape(side, "stage07", t, f"{t}: stage 07 / SDPA flash, with stage 07 / SDPA cuDNN in parentheses"
                        + (f" and the fraction of the `mma.sync` {t} ceiling below" if ceiling else "") + ".", cell, w)
    w("Bold: below SDPA flash, the course's target for stage 07 (≥ 1.0×, aim 1.2×).")
    w("")


def road_section(road, images, out, plots_made):
    """Stage 07's road from road.csv: TFLOP/s of each step and its gain over the step before."""
    w = out.append
    w("### The road of stage 07 {#results_stage07_road}")
    w("")
    if not road:
        w("\\note The road has not been measured yet: `docs/results/road.csv` is not there. "
          "`python3 bench/session.py run road` times every step of stage 07 (and the candidate tile shapes of the "
          "tuning build) and writes it.")
        w("")
        return
    dtype, rows = road_dtype(road)
    w(f"Each step switches on one more feature of the kernel; {dtype}, measured on **{md(span(r['gpu'] for r in rows))}**, "
      f"SM clock {span((r['sm_clock_mhz'] for r in rows), 'MHz')}, {span(r['date'] for r in rows)}. Cells: TFLOP/s, "
      "with the gain over the step before (× < 1 in bold: the step made this shape slower). Tuning candidates are "
      "compared with the final kernel instead.")
    w("")
    road_tables(rows, dtype, "stage07", ("road", "candidate", "sdpa"), images, out, plots_made)


def bridge_table(gpu, road, path):
    """stage07_bridge_table.txt, which stage 07's lesson shows: stage 05 and 06 (float32 FMA) beside
    stage 07's first tensor-core kernel (step 0 of the road) and its final kernel, per shape of
    the road, from gpu_sweep.csv (stages 05, 06) and road.csv (stage 07's steps). The lesson's
    comparison of step 0 with stage 06 reads this table; nothing in it is typed."""
    lines = ["stage 06 (float32 FMA) and stage 07 (tensor cores, bf16): TFLOP/s, and step 0 against stage 06"]
    if not gpu or not road:
        lines.append("not measured yet: needs docs/results/gpu_sweep.csv (stages 05, 06) and road.csv (stage 07's road)")
    else:
        fp32 = {(r["impl"], r["d"], r["N"], r["causal"]): r for r in gpu if r["impl"] in ("stage05", "stage06")}
        steps = {(r["step"], r["d"], r["N"], r["causal"]): r for r in road
                 if r["kind"] == "road" and r["dtype"] == "bf16" and r["step"] is not None}
        final = max((k[0] for k in steps), default=None)
        # Step 0 with stage 06's order of the query tiles (a tuning candidate of the road step).
        in_order = {(r["d"], r["N"], r["causal"]): r for r in road
                    if r["kind"] == "candidate" and r["dtype"] == "bf16" and r["step_name"] == "step 0 in order"}
        shapes = sorted({k[1:] for k in steps if k[0] == 0}, key=lambda k: (k[0], k[2], k[1]))
        lines.append(f"{'d':>4} {'N':>6} {'causal':>6}   {'stage 05':>8} {'stage 06':>8}   {'step 0':>7} "
                     f"{'x stage 06':>10}   {'in order':>8} {'x step 0':>8}   {'final':>7} {'x stage 06':>10}")
        dates = set()
        for d, n, causal in shapes:
            s05, s06 = fp32.get(("stage05", d, n, causal)), fp32.get(("stage06", d, n, causal))
            s0, sf = steps.get((0, d, n, causal)), steps.get((final, d, n, causal))
            cell = lambda r: f"{r['tflops']:8.1f}" if r else f"{'–':>8}"
            ratio = lambda a, b: f"x{a['tflops'] / b['tflops']:.2f}" if a and b else "–"
            io = in_order.get((d, n, causal))
            lines.append(f"{d:>4} {n:>6} {'yes' if causal else 'no':>6}   {cell(s05)} {cell(s06)}   "
                         f"{cell(s0)[1:]} {ratio(s0, s06):>10}   {cell(io)} {ratio(io, s0):>8}   "
                         f"{cell(sf)[1:]} {ratio(sf, s06):>10}")
            for r in (s05, s06, s0, io, sf):
                if r:
                    dates.add((r["gpu"], r["date"]))
        for gpu_name, date in sorted(dates):
            lines.append(f"  measured on {gpu_name}, {date}")
        lines.append("  step 0 visits every key tile (masked) under a causal mask, as stage 05 does; stage 06 skips the tiles above")
        lines.append("  the diagonal, which stage 07 switches on at step 7 (causal skip)")
        lines.append("  in order: step 0 with its query tiles in order (stage 06's order where its rule picks it) instead of heaviest")
        lines.append("  first, the candidate 'step 0 in order' of python3 bench/session.py run road" +
                     ("" if in_order else "; not measured yet (–): the next road run fills it in"))
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def road_aliases(road):
    """\\s07_gain_<step>: each step's gain over the step before along the road (bf16, a span over
    the shapes, "×lo to ×hi"); \\s07_tuning_margin: the best gain of a tile shape tried beside the
    final kernel, at any shape."""
    aliases = OrderedDict()
    gains = lambda pred: [r["gain"] for r in road or [] if r["kind"] == "road" and r["dtype"] == "bf16"
                          and r["gain"] is not None and pred(r)]

    def span_x(values):
        return f"×{min(values):.2f} to ×{max(values):.2f}" if values else "–"

    for alias, name, pred in (
            ("s07_gain_ldmatrix", "ldmatrix", lambda r: True),
            ("s07_gain_swizzle", "swizzle", lambda r: True),
            ("s07_gain_pipeline", "pipeline", lambda r: True),
            ("s07_gain_p_registers", "P in registers", lambda r: True),
            ("s07_gain_exp2", "exp2", lambda r: True),
            ("s07_gain_tile_full", "tile shape", lambda r: not r["causal"]),
            ("s07_gain_tile_causal", "tile shape", lambda r: r["causal"]),
            ("s07_gain_skip_causal", "causal skip", lambda r: r["causal"]),
            ("s07_gain_lazy_d128", "lazy rescale", lambda r: r["d"] == 128),
            ("s07_gain_lazy_d64", "lazy rescale", lambda r: r["d"] == 64)):
        aliases[alias] = span_x(gains(lambda r, n=name, p=pred: r["step_name"] == n and p(r)))

    tried = [r["gain"] for r in road or [] if r["kind"] == "candidate" and r["dtype"] == "bf16" and r["gain"] is not None
             and r["step_name"] != "step 0 in order"]
    aliases["s07_tuning_margin"] = f"{max(0.0, 100 * (max(tried) - 1)):.0f}%" if tried else "–"
    return aliases


def sweep_aliases(gpu, ceilings, results_dir):
    """Stage 07 beside SDPA in the sweep's forward rows (\\s07_vs_flash_bf16, \\s07_vs_cudnn, the
    aim of 1.2× flash, the share of the mma.sync ceiling), and Nsight Compute's counters of the
    road's steps 1 and 2 (ncu_stage07_road.csv) and of the final kernel at d 64 and 128
    (ncu_stage07.csv): \\s07_ncu_*. "–" without data."""
    aliases = OrderedDict()
    fwd = [r for r in gpu or [] if r["pass"] == "forward" and r["dtype"] in HALF_DTYPES]
    idx = {(r["impl"], r["dtype"], r["d"], r["N"], r["causal"]): r for r in fwd}
    ours = [r for r in fwd if r["impl"] == "stage07"]

    def ratios(impl, pred=lambda r: True):
        out = []
        for r in ours:
            other = idx.get((impl, r["dtype"], r["d"], r["N"], r["causal"]))
            if other and pred(r):
                out.append((r, r["tflops"] / other["tflops"]))
        return out

    span_r = lambda rs: f"{min(x for _, x in rs):.2f} to {max(x for _, x in rs):.2f}" if rs else "–"
    aliases["s07_vs_flash_bf16"] = span_r(ratios("sdpa_flash", lambda r: r["dtype"] == "bf16"))
    aliases["s07_vs_flash_fp16"] = span_r(ratios("sdpa_flash", lambda r: r["dtype"] == "fp16"))
    lead = ratios("sdpa_flash", lambda r: not r["causal"])
    aliases["s07_vs_flash_full_lead"] = (f"{100 * (min(x for _, x in lead) - 1):.0f} to {100 * (max(x for _, x in lead) - 1):.0f}%"
                                         if lead else "–")
    flash = ratios("sdpa_flash")
    aim = sorted((r["dtype"], r["d"], r["N"], r["causal"]) for r, x in flash if x >= 1.2)
    where = lambda t, d, n, c: f"{t}, d = {d}, N = {n}, {'causal' if c else 'non-causal'}"
    if aim:
        aliases["s07_aim"] = "reached at " + "; ".join(where(*p) for p in aim)
    elif flash:
        r, x = max(flash, key=lambda rx: rx[1])
        aliases["s07_aim"] = (f"not reached at any point of this run; the closest is {x:.2f} "
                              f"({where(r['dtype'], r['d'], r['N'], r['causal'])})")
    else:
        aliases["s07_aim"] = "–"
    aliases["s07_vs_cudnn"] = span_r(ratios("sdpa_cudnn"))
    ceiling = float(ceilings["mma_bf16"]["value"]) if "mma_bf16" in ceilings else None
    pct = [100 * r["tflops"] / ceiling for r in ours] if ceiling else []
    aliases["s07_pct_of_mma"] = f"{min(pct):.0f} to {max(pct):.0f}%" if pct else "–"
    cudnn128 = [r["tflops"] for r in fwd if r["impl"] == "sdpa_cudnn" and r["d"] == 128]
    aliases["s07_cudnn_best_d128"] = f"{max(cudnn128):.0f}" if cudnn128 else "–"
    aliases.update(ncu_aliases(results_dir))
    return aliases


def ncu_aliases(results_dir):
    """Nsight Compute: the road's steps 1 and 2 (ncu_stage07_road.csv: bank conflicts, wavefronts,
    tensor pipe, time, ldmatrix count), the final kernel at d 64 and 128 (ncu_stage07.csv: tensor
    pipe, issue slots, XU, stalls, local memory, occupancy)."""
    aliases = OrderedDict()
    road_ncu = read_ncu_parts(os.path.join(results_dir, "ncu_stage07_road.csv"))
    final_ncu = read_ncu_parts(os.path.join(results_dir, "ncu_stage07.csv"))

    def metric(parts, part_prefix, name):
        for part, metrics in parts.items():
            if part.startswith(part_prefix) and name in metrics:
                return metrics[name]
        return None

    conflicts, wavefronts = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum", "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"
    tensor, ms, ldsm = ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "gpu__time_duration.sum",
                        "smsp__inst_executed_op_ldsm.sum")
    for step, prefix in ((1, "step 1"), (2, "step 2")):
        c, w_, t, m = (metric(road_ncu, prefix, n) for n in (conflicts, wavefronts, tensor, ms))
        aliases[f"s07_ncu_s{step}_conflicts"] = count_words(c[0]) if c else "–"
        aliases[f"s07_ncu_s{step}_wavefronts"] = count_words(w_[0]) if w_ else "–"
        aliases[f"s07_ncu_s{step}_conflict_share"] = f"{100 * c[0] / w_[0]:.0f}%" if c and w_ and w_[0] else "–"
        aliases[f"s07_ncu_s{step}_tensor"] = f"{t[0]:.1f}%" if t else "–"
        aliases[f"s07_ncu_s{step}_ms"] = f"{m[0]:.1f}" if m else "–"
    n_ldsm = metric(road_ncu, "step 1", ldsm)
    aliases["s07_ncu_ldsm"] = count_words(n_ldsm[0]) if n_ldsm else "–"
    for d in (64, 128):
        counters, sections = f"d={d}: counters", f"d={d}: sections"
        get = lambda prefix, name: metric(final_ncu, prefix, name)
        pct = lambda v: f"{v[0]:.0f}%" if v else "–"
        aliases[f"s07_ncu_d{d}_tensor"] = pct(get(counters, tensor))
        aliases[f"s07_ncu_d{d}_issue"] = pct(get(sections, "Issue Slots Busy"))
        aliases[f"s07_ncu_d{d}_xu"] = pct(get(counters, "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"))
        for key, name in (("wait", "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"),
                          ("throttle", "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio")):
            v = get(counters, name)
            aliases[f"s07_ncu_d{d}_stall_{key}"] = f"{v[0]:.2f}" if v else "–"
        local = get(counters, "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum")
        aliases[f"s07_ncu_d{d}_local"] = ("0" if local[0] == 0 else f"{local[0]:.0f} {local[1].replace('byte', 'B')}") if local else "–"
        warps, occupancy = get(sections, "Theoretical Active Warps per SM"), get(sections, "Theoretical Occupancy")
        aliases[f"s07_ncu_d{d}_warps"] = f"{warps[0]:.0f} ({occupancy[0]:.1f}%)" if warps and occupancy else "–"
    return aliases
