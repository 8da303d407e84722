#!/usr/bin/env python3
"""Writes the results page of the flashcourse site from the measured data in docs/results/.

Inputs (either may be missing; the page then says what is not there yet):
  gpu_sweep.csv    columns impl,dtype,B,H,N,d,causal,median_ms,tflops,gpu,sm_clock_mhz,date
                   (bench/ writes it: our GPU stages and PyTorch SDPA's backends, same shapes)
  cpu_sweep.jsonl  one JSON object per line, as the stage executables print with --json
                   (stage,title,B,H,Nq,Nk,d,causal,layout,first_ms,median_ms,gflops,
                    peak_rss_bytes,rss_before_bytes,intermediate_bytes,pass,machine,date)
Outputs: a Doxygen markdown page (anchor `results`) with tables, plots as PNG (matplotlib; tables
only when it is missing), and checks against the performance targets of the course.

Usage: make_results.py --gpu-csv F --cpu-jsonl F --out results.md --images DIR
"""

import argparse
import csv
import json
import math
import os
import re
import statistics
import sys
from collections import OrderedDict, defaultdict

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    HAVE_MPL = True
except ImportError:  # the page keeps its tables and says why the plots are missing
    HAVE_MPL = False

GPU_COLUMNS = ["impl", "dtype", "B", "H", "N", "d", "causal", "median_ms", "tflops", "gpu", "sm_clock_mhz", "date"]
CPU_KEYS = ["stage", "title", "B", "H", "Nq", "Nk", "d", "causal", "median_ms", "gflops", "peak_rss_bytes",
            "rss_before_bytes", "intermediate_bytes", "pass", "machine", "date"]
SDPA_ORDER = ["sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math"]
SDPA_NAMES = {
    "sdpa_flash": "SDPA flash",
    "sdpa_cudnn": "SDPA cuDNN",
    "sdpa_efficient": "SDPA efficient",
    "sdpa_math": "SDPA math",
}


# ----------------------------------------------------------------------------- helpers
def truthy(value):
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("1", "true", "yes", "causal")


def impl_key(impl):
    """Our stages first, in course order, then SDPA's backends."""
    m = re.fullmatch(r"stage(\d+)", impl)
    if m:
        return (0, int(m.group(1)), impl)
    if impl in SDPA_ORDER:
        return (1, SDPA_ORDER.index(impl), impl)
    return (2, 0, impl)


def impl_name(impl):
    m = re.fullmatch(r"stage(\d+)", impl)
    if m:
        return f"stage {m.group(1)}"
    return SDPA_NAMES.get(impl, impl)


LESSON_PAGES = set()  # pages the site has (--lesson-pages): only those are linked


def impl_ref(impl):
    """A link to the lesson for our stages (when the site has the page), plain text otherwise."""
    m = re.fullmatch(r"stage(\d+)", impl)
    if m:
        return f'\\ref {impl} "stage {m.group(1)}"' if impl in LESSON_PAGES else f"stage {m.group(1)}"
    return SDPA_NAMES.get(impl, impl)


def md(text):
    """Escapes what Doxygen's markdown would otherwise interpret inside table cells."""
    return str(text).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def fmt_bytes(n):
    """Binary prefixes, three significant digits: '796 KiB', '2.02 GiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1000 or unit == "GiB":
            return f"{n:.0f} B" if unit == "B" else f"{fmt_num(n)} {unit}"
        n /= 1024
    return f"{fmt_num(n)} GiB"


def fmt_num(x, digits=3):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    decimals = max(0, digits - 1 - mag)
    return f"{x:.{decimals}f}"


def slug(*parts):
    return re.sub(r"[^A-Za-z0-9]+", "_", "_".join(str(p) for p in parts)).strip("_").lower()


def span(values, unit=""):
    """'1980 MHz' or '1755 to 1980 MHz' or 'A, B'."""
    vals = sorted({str(v).strip() for v in values if str(v).strip()})
    if not vals:
        return "unknown"
    nums = []
    for v in vals:
        try:
            nums.append(float(v))
        except ValueError:
            nums = None
            break
    if nums and unit:
        lo, hi = min(nums), max(nums)
        return f"{lo:g} {unit}" if lo == hi else f"{lo:g} to {hi:g} {unit}"
    return ", ".join(vals)


def pow2_label(n, _pos=None):
    n = int(round(n))
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


# ----------------------------------------------------------------------------- reading
def read_gpu(path, notes, info):
    if not os.path.exists(path):
        return None
    rows = []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in GPU_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            notes.append(f"`{os.path.basename(path)}` lacks the columns {', '.join(missing)}; it is not used.")
            return []
        bad = unmeasured = 0
        for raw in reader:
            if not (raw.get("tflops") or "").strip() or not (raw.get("median_ms") or "").strip():
                unmeasured += 1  # a backend without a kernel for this dtype/shape, or skipped for memory
                continue
            try:
                rows.append({
                    "impl": raw["impl"].strip(),
                    "dtype": raw["dtype"].strip(),
                    "B": int(raw["B"]), "H": int(raw["H"]), "N": int(raw["N"]), "d": int(raw["d"]),
                    "causal": truthy(raw["causal"]),
                    "median_ms": float(raw["median_ms"]),
                    "tflops": float(raw["tflops"]),
                    "gpu": raw["gpu"].strip(),
                    "sm_clock_mhz": raw["sm_clock_mhz"].strip(),
                    "date": raw["date"].strip(),
                })
            except (KeyError, ValueError, TypeError, AttributeError):
                bad += 1
        if bad:
            notes.append(f"{bad} malformed line(s) of `{os.path.basename(path)}` were skipped.")
        if unmeasured:
            info.append(f"{unmeasured} row(s) of `{os.path.basename(path)}` have no time: the sweep found no "
                        "kernel for that dtype and shape, or skipped it (SDPA's math backend where its N × N "
                        "matrices would not fit). They show as – in the tables.")
    return rows


def read_gpu_meta(csv_path):
    """The sweep's own record beside the CSV (gpu_sweep.json): PyTorch version, timing method."""
    path = os.path.splitext(csv_path)[0] + ".json"
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
        return {k: str(meta[k]) for k in ("gpu", "torch", "max_sm_clock_mhz", "method") if meta.get(k) not in (None, "")}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def read_cpu(path, notes):
    if not os.path.exists(path):
        return None
    rows, bad = [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
                missing = [k for k in CPU_KEYS if k not in r]
                if missing:
                    raise KeyError(missing)
                rows.append({
                    "stage": str(r["stage"]).zfill(2), "title": str(r["title"]),
                    "B": int(r["B"]), "H": int(r["H"]), "Nq": int(r["Nq"]), "Nk": int(r["Nk"]), "d": int(r["d"]),
                    "causal": truthy(r["causal"]), "layout": str(r.get("layout", "")),
                    "median_ms": float(r["median_ms"]), "gflops": float(r["gflops"]),
                    "extra_bytes": max(0.0, float(r["peak_rss_bytes"]) - float(r["rss_before_bytes"])),
                    "peak_rss_bytes": float(r["peak_rss_bytes"]),
                    "intermediate_bytes": float(r["intermediate_bytes"]),
                    "pass": truthy(r["pass"]), "machine": str(r["machine"]), "date": str(r["date"]),
                })
            except (ValueError, KeyError, TypeError):
                bad += 1
    if bad:
        notes.append(f"{bad} malformed line(s) of `{os.path.basename(path)}` were skipped.")
    return rows


# ----------------------------------------------------------------------------- plots
def plot_gpu(group_rows, impls, title, path):
    fig, ax = plt.subplots(figsize=(8.2, 4.2), dpi=110)
    for impl in impls:
        pts = sorted((r["N"], r["tflops"]) for r in group_rows if r["impl"] == impl)
        if not pts:
            continue
        ours = impl.startswith("stage")
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o" if ours else "s",
                linestyle="-" if ours else "--", linewidth=2.2 if ours else 1.4, markersize=5,
                label=impl_name(impl))
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(pow2_label))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("TFLOP/s")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_cpu(group_rows, stages, title, path):
    fig, (ax_mem, ax_time) = plt.subplots(1, 2, figsize=(10.5, 4.2), dpi=110)
    for stage in stages:
        rows = sorted((r for r in group_rows if r["stage"] == stage), key=lambda r: r["Nq"])
        if not rows:
            continue
        label = f"stage {stage}"
        n = [r["Nq"] for r in rows]
        ax_mem.plot(n, [max(r["extra_bytes"], 1.0) / 2**20 for r in rows], marker="o", label=label)
        ax_time.plot(n, [r["median_ms"] for r in rows], marker="o", label=label)
    for ax in (ax_mem, ax_time):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(pow2_label))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("sequence length N")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=9)
    ax_mem.set_ylabel("peak memory above the inputs (MiB)")
    ax_mem.set_title("memory during the run", fontsize=11)
    ax_time.set_ylabel("median time (ms)")
    ax_time.set_title("time", fontsize=11)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ----------------------------------------------------------------------------- GPU section
def gpu_section(rows, meta, images, out, plots_made):
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
        # Groups where our stages ran come first; then the ones with SDPA alone.
        ours_dtypes = {r["dtype"] for r in grows if r["impl"].startswith("stage")}
        groups = OrderedDict()
        for r in sorted(grows, key=lambda r: (r["dtype"] not in ours_dtypes, r["dtype"], r["d"], r["causal"])):
            groups.setdefault((r["dtype"], r["d"], r["causal"]), []).append(r)
        level = "####" if len(by_gpu) > 1 else "###"
        for (dtype, d, causal), g in groups.items():
            mask = "causal" if causal else "non-causal"
            anchor = slug("results_gpu", gpu if len(by_gpu) > 1 else "", dtype, "d", d, mask)
            w(f"{level} {dtype}, d = {d}, {mask} {{#{anchor}}}")
            w("")
            impls = sorted({r["impl"] for r in g}, key=impl_key)
            if not any(i.startswith("stage") for i in impls):
                w(f"None of our stages runs in {dtype} yet: these are the numbers a {dtype} stage will be "
                  "measured against.")
                w("")
            if HAVE_MPL:
                name = f"{anchor}.png"
                plot_gpu(g, impls, f"{gpu}: {dtype}, d = {d}, {mask}", os.path.join(images, name))
                plots_made.append(name)
                w(f'\\image html {name} "TFLOP/s against N, {dtype}, d = {d}, {mask}"')
                w("")
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


def ratio_summary(ratios):
    vals = [r for _, r in ratios]
    return min(vals), statistics.median(vals), max(vals)


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


def verdict(ratios, ok, worst_is_max):
    """'met', or 'not met at K of M shapes (worst: ...)'."""
    failing = [(key, r) for key, r in ratios if not ok(r)]
    if not failing:
        return "met"
    key, r = (max if worst_is_max else min)(failing, key=lambda kr: kr[1])
    return f"**not met** at {len(failing)} of {len(ratios)} shapes (worst {fmt_num(r)} at {shape_text(key)})"


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
        lo, med, hi = ratio_summary(ratios)
        lines.append(f"| {impl_ref('stage06')}: causal time / non-causal time, N ≥ 4096 | ≤ 0.55 | "
                     f"{fmt_num(lo)} to {fmt_num(hi)} (median {fmt_num(med)}, {len(ratios)} shapes) | "
                     f"{verdict(ratios, lambda r: r <= 0.55, True)} |")

    # Stages 05/06 in fp32: TFLOP/s / SDPA efficient's, target >= 0.5.
    for stage in ("stage05", "stage06"):
        ratios = []
        for (impl, dtype, b, h, n, d, causal), r in idx.items():
            if impl == stage and dtype in ("fp32", "float32"):
                ref = idx.get(("sdpa_efficient", dtype, b, h, n, d, causal))
                if ref and ref["tflops"] > 0:
                    ratios.append(((n, d, causal), r["tflops"] / ref["tflops"]))
        if ratios:
            lo, med, hi = ratio_summary(ratios)
            lines.append(f"| {impl_ref(stage)} fp32 / SDPA efficient fp32 | ≥ 0.5× | {fmt_num(lo)}× to "
                         f"{fmt_num(hi)}× (median {fmt_num(med)}×, {len(ratios)} shapes) | "
                         f"{verdict(ratios, lambda r: r >= 0.5, False)} |")
            failing = [key for key, r in ratios if r < 0.5]
            if stage == "stage05" and failing and all(key[-1] is True for key in failing):
                after.append("Stage 05 misses the fp32 target only on causal shapes: it still computes the key "
                             "tiles the mask hides, at the cost of a non-causal problem. Skipping them is stage "
                             "06's lesson.")

    # Stage 07 (and any later stage) in bf16/fp16: TFLOP/s / SDPA flash's, target >= 1.0.
    for stage in sorted({r["impl"] for r in rows if re.fullmatch(r"stage(0[7-9]|[1-9]\d)", r["impl"])}, key=impl_key):
        ratios = []
        for (impl, dtype, b, h, n, d, causal), r in idx.items():
            if impl == stage and dtype in ("bf16", "fp16") and d in (64, 128):
                ref = idx.get(("sdpa_flash", dtype, b, h, n, d, causal))
                if ref and ref["tflops"] > 0:
                    ratios.append(((dtype, n, d, causal), r["tflops"] / ref["tflops"]))
        if ratios:
            lo, med, hi = ratio_summary(ratios)
            lines.append(f"| {impl_ref(stage)} bf16/fp16 / SDPA flash | ≥ 1.0× | {fmt_num(lo)}× to {fmt_num(hi)}× "
                         f"(median {fmt_num(med)}×, {len(ratios)} shapes) | {verdict(ratios, lambda r: r >= 1.0, False)} |")

    w(f"{level} Targets {{#{anchor}}}")
    w("")
    if not lines:
        w("The data has none of the shape pairs the course's GPU targets compare (stage 06 causal and "
          "non-causal at N ≥ 4096; stages 05/06 and SDPA efficient in fp32; stage 07 and SDPA flash in "
          "bf16/fp16).")
        w("")
        return
    w("| target | goal | measured | verdict |")
    w("|---|---|---|---|")
    out.extend(lines)
    w("")
    for line in after:
        w(line)
        w("")


# ----------------------------------------------------------------------------- CPU section
def cpu_section(rows, images, out, plots_made):
    w = out.append
    w("## CPU: stages 01 to 04 {#results_cpu}")
    w("")
    if rows is None:
        w("\\note No CPU measurements yet: `docs/results/cpu_sweep.jsonl` is not there. It collects the "
          "`--json` records of the CPU stages run with `--bench` over a range of N; the next docs build "
          "turns it into tables and plots here.")
        w("")
        return
    if not rows:
        w("\\note `docs/results/cpu_sweep.jsonl` holds no usable records yet.")
        w("")
        return
    w(f"Measured on **{md(span(r['machine'] for r in rows))}**, {span(r['date'] for r in rows)}. "
      "Time is the median of the `--bench` repetitions (the first run where the sweep did not bench). "
      "Memory is the process's peak resident set during the stage's first run minus what it held "
      "before (the inputs and outputs): what the stage itself allocates. Intermediates are the "
      "stage's own count of the buffers it allocates.")
    w("")
    groups = OrderedDict()
    for r in sorted(rows, key=lambda r: (r["d"], r["causal"], r["B"], r["H"])):
        groups.setdefault((r["d"], r["causal"], r["B"], r["H"]), []).append(r)
    for (d, causal, b, h), g in groups.items():
        mask = "causal" if causal else "non-causal"
        anchor = slug("results_cpu", "d", d, mask, "b", b, "h", h)
        w(f"### d = {d}, {mask}, B = {b}, H = {h} {{#{anchor}}}")
        w("")
        stages = sorted({r["stage"] for r in g})
        if HAVE_MPL:
            name = f"{anchor}.png"
            plot_cpu(g, stages, f"CPU stages, d = {d}, {mask}, B = {b}, H = {h}", os.path.join(images, name))
            plots_made.append(name)
            w(f'\\image html {name} "Peak memory and time against N"')
            w("")
        # Two tables, one row per problem size and one column per stage: time, then memory.
        sizes = sorted({(r["Nq"], r["Nk"]) for r in g})
        cell = {(r["Nq"], r["Nk"], r["stage"]): r for r in g}
        size_head = "N" if all(nq == nk for nq, nk in sizes) else "Nq × Nk"
        heads = " | ".join(impl_ref("stage" + st) for st in stages)

        def size_label(nq, nk):
            return str(nq) if nq == nk else f"{nq} × {nk}"

        def mark(r):
            return "" if r["pass"] else " **FAIL**"

        def table(caption, format_cell):
            # One row per size, one column per stage; "–" where a stage has no run at that size.
            w(caption)
            w("")
            w(f"| {size_head} | {heads} |")
            w("|---:|" + "---:|" * len(stages))
            for nq, nk in sizes:
                cells = [format_cell(r) if (r := cell.get((nq, nk, st))) else "–" for st in stages]
                w(f"| {size_label(nq, nk)} | " + " | ".join(cells) + " |")
            w("")

        table("Median time in ms, with GFLOP/s in parentheses:",
              lambda r: f"{fmt_num(r['median_ms'])} ({fmt_num(r['gflops'])}){mark(r)}")
        table("Memory above the inputs, measured, with the stage's own count of its intermediates in parentheses:",
              lambda r: f"{fmt_bytes(r['extra_bytes'])} ({fmt_bytes(r['intermediate_bytes'])})")
        failed = [r for r in g if not r["pass"]]
        if failed:
            w(f"\\warning {len(failed)} of these runs failed their own check (marked **FAIL**).")
            w("")
    cpu_targets(rows, out)


def cpu_targets(rows, out):
    w = out.append
    w("### Targets {#results_cpu_targets}")
    w("")
    lines = []
    idx = {(r["stage"], r["B"], r["H"], r["Nq"], r["Nk"], r["d"], r["causal"]): r for r in rows}
    for (stage, b, h, nq, nk, d, causal), r in sorted(idx.items()):
        if stage == "04" and nq == 16384 and nk == 16384:
            base = idx.get(("01", b, h, nq, nk, d, causal))
            if base and base["extra_bytes"] > 0:
                ratio = r["extra_bytes"] / base["extra_bytes"]
                lines.append(f"| {impl_ref('stage04')} memory / {impl_ref('stage01')} memory, N = 16384, d = {d}, "
                             f"B = {b}, H = {h} | ≤ 5% | {100 * ratio:.2f}% ({fmt_bytes(r['extra_bytes'])} vs "
                             f"{fmt_bytes(base['extra_bytes'])}) | {'met' if ratio <= 0.05 else '**not met**'} |")
    if not lines:
        w("The data has no pair of stage 01 and stage 04 runs at N = 16384 on the same shape, which the "
          "memory target (stage 04 at most 5% of stage 01) compares. The GEMM target of stage 04 is "
          "measured in its lesson.")
        w("")
        return
    w("| target | goal | measured | verdict |")
    w("|---|---|---|---|")
    out.extend(lines)
    w("")


# ----------------------------------------------------------------------------- page
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu-csv", required=True)
    ap.add_argument("--cpu-jsonl", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--images", required=True)
    ap.add_argument("--lesson-pages", default="", help="comma-separated page names the site has (stage01,...)")
    args = ap.parse_args()
    LESSON_PAGES.update(p for p in args.lesson_pages.split(",") if p)
    os.makedirs(args.images, exist_ok=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    notes, info = [], []
    gpu = read_gpu(args.gpu_csv, notes, info)
    cpu = read_cpu(args.cpu_jsonl, notes)

    out = ["# Measured results {#results}", ""]
    out.append("Every number on this page is read from `docs/results/` and turned into tables and plots by "
               "`docs/make_results.py` each time the docs are built: nothing here is typed by hand. "
               "The lessons explain the numbers; this page collects them in one place, with the machine "
               "and the date they were measured on.")
    out.append("")
    out.append("[TOC]")
    out.append("")
    if not HAVE_MPL:
        out.append("\\note The plots need matplotlib (`sudo apt-get install python3-matplotlib`); "
                   "this build has tables only.")
        out.append("")
    for n in notes:
        out.append(f"\\warning {n}")
        out.append("")
    for n in info:
        out.append(f"\\note {n}")
        out.append("")

    plots = []
    gpu_section(gpu, read_gpu_meta(args.gpu_csv), args.images, out, plots)
    cpu_section(cpu, args.images, out, plots)

    out.append("## Where the data comes from {#results_sources}")
    out.append("")
    out.append("| file | written by | present |")
    out.append("|---|---|---|")
    out.append(f"| `docs/results/gpu_sweep.csv` | the GPU sweep in `bench/` | {'yes' if gpu is not None else 'not yet'} |")
    out.append(f"| `docs/results/cpu_sweep.jsonl` | the CPU stages with `--bench --json` | "
               f"{'yes' if cpu is not None else 'not yet'} |")
    out.append("")

    # Remove plots of groups that are gone, so the image folder holds only what the page shows.
    for f in os.listdir(args.images):
        if f.startswith("results_") and f.endswith(".png") and f not in plots:
            os.remove(os.path.join(args.images, f))
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
