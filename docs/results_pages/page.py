"""Pieces several sections of the results page write alike: the headings of (GPU, d, mask) groups,
an implementation's rows beside the others' on the same shapes, a table of TFLOP/s, a targets
table with its verdicts, a record shown as written, and the tables of a road (stages 07 and 11).
Every writer appends lines of Doxygen markdown to `out`."""

import os
import statistics
from collections import OrderedDict

from . import plots
from .formatting import HALF_DTYPES, fmt_num, impl_ref, md, slug


def gpu_sections(rows, prefix, gpus, w):
    """Groups `rows` by (GPU, d, causal) and writes one heading per group (the GPU named only when
    there are several); yields (gpu, d, mask, anchor, group) for the section's body."""
    groups = OrderedDict()
    for r in sorted(rows, key=lambda r: (r["gpu"], r["d"], r["causal"])):
        groups.setdefault((r["gpu"], r["d"], r["causal"]), []).append(r)
    for (gpu, d, causal), g in groups.items():
        mask = "causal" if causal else "non-causal"
        anchor = slug(prefix, gpu if len(gpus) > 1 else "", "d", d, mask)
        w(f"### d = {d}, {mask}{', ' + md(gpu) if len(gpus) > 1 else ''} {{#{anchor}}}")
        w("")
        yield gpu, d, mask, anchor, g


def side_by_side(rows, ours, impls):
    """The rows of `impls` measured on the shapes (GPU, dtype, B, H, N, d, causal) where `ours` was:
    the dtypes of ours, those rows, and their GPUs."""
    dtypes = [t for t in HALF_DTYPES if any(r["dtype"] == t for r in ours)]
    shape = lambda r: (r["gpu"], r["dtype"], r["B"], r["H"], r["N"], r["d"], r["causal"])
    shapes_of = {shape(r) for r in ours}
    side = [r for r in rows if r["impl"] in impls and r["dtype"] in dtypes and shape(r) in shapes_of]
    return dtypes, side, sorted({r["gpu"] for r in side})


def tflops_table(g, dtypes, impls, w):
    """One (GPU, d, mask) group of a half-precision stage beside SDPA: a row per shape, a column per
    (dtype, implementation), TFLOP/s and median time."""
    cols = [(t, i) for t in dtypes for i in impls]
    cell = {(r["N"], r["B"], r["H"], r["dtype"], r["impl"]): r for r in g}
    w("| N | B | H | " + " | ".join(f"{impl_ref(i)} {t}" for t, i in cols) + " |")
    w("|---:|---:|---:|" + "---:|" * len(cols))
    for n, b, h in sorted({(r["N"], r["B"], r["H"]) for r in g}):
        cells = []
        for t, i in cols:
            r = cell.get((n, b, h, t, i))
            cells.append(f"{fmt_num(r['tflops'])} ({fmt_num(r['median_ms'])} ms)" if r else "–")
        w(f"| {n} | {b} | {h} | " + " | ".join(cells) + " |")
    w("")
    w("Cells: TFLOP/s (median time); – where a backend has no kernel for the dtype or shape.")
    w("")


def shape_text(key):
    """(dtype, n, d, causal)-like tuples as `bf16, N = 4096, d = 64, causal`."""
    parts = []
    for k in key:
        if isinstance(k, bool):
            parts.append("causal" if k else "non-causal")
        elif isinstance(k, str):
            parts.append(k)
    names = ["N", "d"]
    ints = [k for k in key if isinstance(k, int) and not isinstance(k, bool)]
    parts[1 if parts and parts[0] in ("fp32", "bf16", "fp16") else 0:0] = [f"{n} = {v}" for n, v in zip(names, ints)]
    return ", ".join(parts)


def verdict(ratios, ok, worst_is_max, what="shapes"):
    """'met', or 'not met at K of M shapes (worst: ...)'."""
    failing = [(key, r) for key, r in ratios if not ok(r)]
    if not failing:
        return "met"
    key, r = (max if worst_is_max else min)(failing, key=lambda kr: kr[1])
    return f"**not met** at {len(failing)} of {len(ratios)} {what} (worst {fmt_num(r)} at {shape_text(key)})"


def target_row(label, goal, ratios, ok, worst_is_max=False, unit="×", what="shapes"):
    """A row of a targets table: the span and median of `ratios` ((key, ratio) pairs) and the verdict."""
    vals = [r for _, r in ratios]
    lo, med, hi = min(vals), statistics.median(vals), max(vals)
    return (f"| {label} | {goal} | {fmt_num(lo)}{unit} to {fmt_num(hi)}{unit} (median {fmt_num(med)}{unit}, "
            f"{len(ratios)} {what}) | {verdict(ratios, ok, worst_is_max, what)} |")


def targets_table(lines, out):
    """The rows of a targets table under its header, then a blank line; nothing without rows."""
    if lines:
        out.extend(["| target | goal | measured | verdict |", "|---|---|---|---|", *lines, ""])


def show_plot(draw, name, caption, images, plots_made, w):
    """draw(path) writes the plot images/`name`; the page shows it here under `caption`. Nothing
    without matplotlib: the tables beside it stay."""
    if not plots.HAVE_MPL:
        return
    draw(os.path.join(images, name))
    plots_made.append(name)
    w(f'\\image html {name} "{caption}"')
    w("")


def ratios_by_shape(side, impl, dtype, caption, cell, w):
    """One dtype's table of ratios: a row per (GPU, d, mask) where `impl` ran, a column per N, each
    cell cell(gpu, n, d, causal) (the cells taken row by row, left to right)."""
    shapes = sorted({(r["gpu"], r["d"], r["causal"]) for r in side if r["dtype"] == dtype and r["impl"] == impl})
    sizes = sorted({r["N"] for r in side if r["dtype"] == dtype and r["impl"] == impl})
    w(caption)
    w("")
    w("| d | mask | " + " | ".join(f"N = {n}" for n in sizes) + " |")
    w("|---:|---|" + "---:|" * len(sizes))
    for gpu, d, causal in shapes:
        w(f"| {d} | {'causal' if causal else 'non-causal'} | " + " | ".join(cell(gpu, n, d, causal) for n in sizes) + " |")
    w("")


def section_opening(w, heading, rows, missing):
    """A section's heading; where `rows` is empty, also the line `missing` that says what the data
    lacks. True when there are rows to show."""
    w(heading)
    w("")
    if not rows:
        w(missing)
        w("")
        return False
    return True


def verbatim_file(path, out):
    """A record of docs/results/ shown on the page as it was written, in a fenced block."""
    out.append("~~~")
    with open(path, encoding="utf-8") as f:
        out.extend(line.rstrip("\n") for line in f)
    out.extend(["~~~", ""])


def road_dtype(road):
    """The dtype a road's section shows (bf16 where the road has it) and the road's rows in it."""
    dtype = "bf16" if any(r["dtype"] == "bf16" for r in road) else road[0]["dtype"]
    return dtype, [r for r in road if r["dtype"] == dtype]


def road_tables(rows, dtype, stage, kinds, images, out, plots_made, vs_cudnn=False):
    """The tables of a road (road.csv or road11.csv, one dtype): what each step changes, then for
    each N a plot and a table, one column per (d, causal) and one row per step of `kinds` (a
    candidate is compared with the final kernel). A cell: TFLOP/s, the gain over the step before (in
    bold below 1), and with `vs_cudnn` the ratio to SDPA cuDNN after a slash (the plot then draws
    cuDNN as its reference line)."""
    w = out.append
    ideas = OrderedDict((r["step"], r) for r in sorted(rows, key=lambda r: r["step"] or 0) if r["kind"] == "road")
    if any(r["idea"] for r in ideas.values()):
        w("| step | name | what it changes |")
        w("|---:|---|---|")
        for step, r in ideas.items():
            w(f"| {step} | {md(r['step_name'])} | {md(r['idea'])} |")
        w("")
    number = stage[len("stage"):]
    for n in sorted({r["N"] for r in rows}):
        at_n = [r for r in rows if r["N"] == n]
        cols = sorted({(r["d"], r["causal"]) for r in at_n})
        cell = {(r["kind"], r["step"], r["step_name"], r["d"], r["causal"]): r for r in at_n}
        anchor = slug(f"results_{stage}_road", dtype, "n", n)
        w(f"#### N = {n} {{#{anchor}}}")
        w("")
        if any(r["kind"] == "road" for r in at_n):
            show_plot(lambda path: plots.plot_road(at_n, f"stage {number} step by step, {dtype}, N = {n}", path,
                                                   **({"sdpa": "sdpa_cudnn"} if vs_cudnn else {})),
                      f"{anchor}.png", f"TFLOP/s of each step of stage {number}'s road, {dtype}, N = {n}", images,
                      plots_made, w)
        w("| step | name | " + " | ".join(f"d = {d}, {'causal' if c else 'non-causal'}" for d, c in cols) + " |")
        w("|---:|---|" + "---:|" * len(cols))
        for kind in kinds:
            for step, label in sorted({(r["step"], r["step_name"]) for r in at_n if r["kind"] == kind},
                                      key=lambda s: (-1 if s[0] is None else s[0], s[1])):
                cells = []
                for d, c in cols:
                    r = cell.get((kind, step, label, d, c))
                    if not r:
                        cells.append("–")
                        continue
                    text = fmt_num(r["tflops"])
                    if r["gain"] is not None:
                        bold = r["gain"] < 1.0 and kind == "road"
                        text += f" (**×{fmt_num(r['gain'])}**)" if bold else f" (×{fmt_num(r['gain'])})"
                    if vs_cudnn and kind == "road" and r["vs_cudnn"] is not None:
                        text += f" / {fmt_num(r['vs_cudnn'])}"
                    cells.append(text)
                title = md(label) + (" (candidate)" if kind == "candidate" else "")
                w(f"| {'' if step is None else step} | {title} | " + " | ".join(cells) + " |")
        w("")
