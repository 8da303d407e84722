"""The results page's first GPU section: our stages beside PyTorch SDPA in every dtype that has no
section of its own (stages 05 and 06 in float32 beside SDPA efficient; the dtypes stage 07 did not
run), from gpu_sweep.csv's forward rows; and the course's GPU targets checked on that sweep (stage
06's causal saving, stages 05/06 against SDPA efficient, stage 07 and later against SDPA flash)."""

from collections import OrderedDict

from . import plots
from .formatting import fmt_num, impl_key, impl_name, impl_ref, md, slug, span, stage_number
from .page import show_plot, target_row, targets_table


def plot_gpu(group_rows, impls, title, path):
    """TFLOP/s against N, one line per implementation: ours solid, SDPA's dashed."""
    fig, ax = plots.plt.subplots(figsize=(8.2, 4.2), dpi=110)
    for impl in impls:
        pts = sorted((r["N"], r["tflops"]) for r in group_rows if r["impl"] == impl)
        if not pts:
            continue
        ours = impl.startswith("stage")
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o" if ours else "s",
                linestyle="-" if ours else "--", linewidth=2.2 if ours else 1.4, markersize=5,
                label=impl_name(impl))
    plots.finish_tflops_against_n(fig, ax, title, path)


def gpu_section(rows, meta, images, out, plots_made):
    """One group per (dtype, d, causal) of the GPU sweep, stage 07's 16-bit dtypes left to its own
    section: a plot and a table of every implementation's TFLOP/s; then the targets. `rows`: the
    forward rows of the sweep (None: no sweep; []: nothing usable), `meta`: its record."""
    w = out.append
    w("## GPU: our kernels beside PyTorch SDPA {#results_gpu}")
    w("")
    if rows is None:
        w("\\note No GPU measurements yet: `docs/results/gpu_sweep.csv` is not there. The sweep in "
          "`bench/` writes it on a machine with a CUDA GPU (and PyTorch for the SDPA columns); the next "
          "docs build turns it into tables and plots here.")
        w("")
        return
    if not rows:
        w("\\note `docs/results/gpu_sweep.csv` holds no usable rows yet.")
        w("")
        return

    by_gpu = OrderedDict()
    for r in sorted(rows, key=lambda r: r["gpu"]):
        by_gpu.setdefault(r["gpu"], []).append(r)
    w("Each number is the median of repeated timed runs with CUDA events; TFLOP/s count "
      "\\f$4 B H N^2 d\\f$ operations (half of that for causal attention), the convention of "
      "fa::attention_flops(). Our stages and SDPA's backends ran on the same shapes in one sweep.")
    w("")
    for gpu, grows in by_gpu.items():
        if len(by_gpu) > 1:
            w(f"### {md(gpu)} {{#results_gpu_{slug(gpu)}}}")
            w("")
        w(f"Measured on **{md(gpu)}**, SM clock {span((r['sm_clock_mhz'] for r in grows), 'MHz')}, "
          f"{span(r['date'] for r in grows)}.")
        w("")
        if meta.get("gpu") == gpu:
            extra = []
            if meta.get("torch"):
                extra.append(f"PyTorch {md(meta['torch'])} for the SDPA columns")
            if meta.get("max_sm_clock_mhz"):
                extra.append(f"the GPU's maximum SM clock is {md(meta['max_sm_clock_mhz'])} MHz")
            if meta.get("method"):
                extra.append(f"timing: {md(meta['method'])}")
            if extra:
                w("From the sweep's record (`gpu_sweep.json`): " + "; ".join(extra) + ".")
                w("")
        # Groups where our stages ran come first; then the ones with SDPA alone. The 16-bit dtypes
        # stage 07 ran in have their own section (stage07.section), beside flash and cuDNN.
        ours_dtypes = {r["dtype"] for r in grows if r["impl"].startswith("stage")}
        stage07_dtypes = {r["dtype"] for r in grows if r["impl"] == "stage07"}
        groups = OrderedDict()
        for r in sorted(grows, key=lambda r: (r["dtype"] not in ours_dtypes, r["dtype"], r["d"], r["causal"])):
            if r["dtype"] not in stage07_dtypes:
                groups.setdefault((r["dtype"], r["d"], r["causal"]), []).append(r)
        level = "####" if len(by_gpu) > 1 else "###"
        for (dtype, d, causal), g in groups.items():
            mask = "causal" if causal else "non-causal"
            anchor = slug("results_gpu", gpu if len(by_gpu) > 1 else "", dtype, "d", d, mask)
            w(f"{level} {dtype}, d = {d}, {mask} {{#{anchor}}}")
            w("")
            impls = sorted({r["impl"] for r in g}, key=impl_key)
            if not any(i.startswith("stage") for i in impls):
                w(f"None of our stages was measured in {dtype} here: these are the numbers a {dtype} stage is "
                  "measured against.")
                w("")
            show_plot(lambda path: plot_gpu(g, impls, f"{gpu}: {dtype}, d = {d}, {mask}", path), f"{anchor}.png",
                      f"TFLOP/s against N, {dtype}, d = {d}, {mask}", images, plots_made, w)
            # One row per shape; each cell TFLOP/s with the median time under it.
            shapes = sorted({(r["N"], r["B"], r["H"]) for r in g})
            cell = {(r["N"], r["B"], r["H"], r["impl"]): r for r in g}
            w("| N | B | H | " + " | ".join(impl_ref(i) for i in impls) + " |")
            w("|---:|---:|---:|" + "---:|" * len(impls))
            for n, b, h in shapes:
                cells = []
                for i in impls:
                    r = cell.get((n, b, h, i))
                    cells.append(f"{fmt_num(r['tflops'])} ({fmt_num(r['median_ms'])} ms)" if r else "–")
                w(f"| {n} | {b} | {h} | " + " | ".join(cells) + " |")
            w("")
            w("Cells: TFLOP/s (median time).")
            w("")
        gpu_targets(grows, out, slug("results_gpu_targets", gpu if len(by_gpu) > 1 else ""), level)


def half_precision_stages(rows):
    """Stage 07 and every later stage of the sweep (two-digit numbers from 07), in course order."""
    numbers = {r["impl"]: stage_number(r["impl"]) for r in rows}
    return sorted((impl for impl, n in numbers.items() if n and len(n) == 2 and int(n) >= 7), key=impl_key)


def gpu_targets(rows, out, anchor, level):
    """The course's GPU performance targets, checked on this data where it has the shapes."""
    w = out.append
    idx = {(r["impl"], r["dtype"], r["B"], r["H"], r["N"], r["d"], r["causal"]): r for r in rows}
    lines, after = [], []

    # Stage 06: causal time / non-causal time at N >= 4096, target <= 0.55.
    ratios = []
    for (impl, dtype, b, h, n, d, causal), r in idx.items():
        if impl == "stage06" and causal and n >= 4096:
            full = idx.get((impl, dtype, b, h, n, d, False))
            if full and full["median_ms"] > 0:
                ratios.append(((dtype, n, d), r["median_ms"] / full["median_ms"]))
    if ratios:
        lines.append(target_row(f"{impl_ref('stage06')}: causal time / non-causal time, N ≥ 4096", "≤ 0.55", ratios,
                                lambda r: r <= 0.55, True, unit=""))

    # Stages 05/06 in fp32: TFLOP/s / SDPA efficient's, target >= 0.5.
    for stage in ("stage05", "stage06"):
        ratios = []
        for (impl, dtype, b, h, n, d, causal), r in idx.items():
            if impl == stage and dtype in ("fp32", "float32"):
                ref = idx.get(("sdpa_efficient", dtype, b, h, n, d, causal))
                if ref and ref["tflops"] > 0:
                    ratios.append(((n, d, causal), r["tflops"] / ref["tflops"]))
        if ratios:
            lines.append(target_row(f"{impl_ref(stage)} fp32 / SDPA efficient fp32", "≥ 0.5×", ratios,
                                    lambda r: r >= 0.5))
            failing = [key for key, r in ratios if r < 0.5]
            if stage == "stage05" and failing and all(key[-1] is True for key in failing):
                after.append("Stage 05 misses the fp32 target only on causal shapes: it still computes the key "
                             "tiles the mask hides, at the cost of a non-causal problem. Skipping them is stage "
                             "06's lesson.")

    # Stage 07 (and any later stage) in bf16/fp16: TFLOP/s / SDPA flash's, target >= 1.0.
    for stage in half_precision_stages(rows):
        ratios = []
        for (impl, dtype, b, h, n, d, causal), r in idx.items():
            if impl == stage and dtype in ("bf16", "fp16") and d in (64, 128):
                ref = idx.get(("sdpa_flash", dtype, b, h, n, d, causal))
                if ref and ref["tflops"] > 0:
                    ratios.append(((dtype, n, d, causal), r["tflops"] / ref["tflops"]))
        if ratios:
            lines.append(target_row(f"{impl_ref(stage)} bf16/fp16 / SDPA flash", "≥ 1.0×", ratios, lambda r: r >= 1.0))

    w(f"{level} Targets {{#{anchor}}}")
    w("")
    if not lines:
        w("The data has none of the shape pairs the course's GPU targets compare (stage 06 causal and "
          "non-causal at N ≥ 4096; stages 05/06 and SDPA efficient in fp32; stage 07 and SDPA flash in "
          "bf16/fp16).")
        w("")
        return
    targets_table(lines, out)
    for line in after:
        w(line)
        w("")
