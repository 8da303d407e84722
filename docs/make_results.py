#!/usr/bin/env python3
"""Writes the results page of the flashcourse site from the measured data in docs/results/.

Inputs (any may be missing; the page then says what is not there yet):
  gpu_sweep.csv    columns impl,dtype,B,H,N,d,causal,median_ms,tflops,gpu,sm_clock_mhz,date
                   (bench/ writes it: our GPU stages and PyTorch SDPA's backends, same shapes;
                   later sweeps add columns, e.g. step, which are not needed here, and pass:
                   forward, backward or fwd+bwd, read when present; a file without it holds
                   forward rows only). Beside it, gpu_sweep.json (the sweep's record: PyTorch
                   version, timing, the mma.sync ceiling) and road.csv (stage 07's road: each
                   step's TFLOP/s and gain); road11.csv (stage 11's road, with each step's ratio
                   to SDPA cuDNN) and stage11_first_contact.txt (bench/hopper_first_contact.sh's
                   record: the first timings of stage 11, shown until the sweep has stage 11);
                   stage09_steps_quick.txt (stage 09's road: bench/sdpa_compare.py's tables of the
                   default main kernel and of each other step, bench/gpu_session.sh quick with STEPS09);
                   mma_ceiling.jsonl and wgmma_ceiling.jsonl (the ceilings the lessons quote);
                   stage10.csv (bench/sdpa_compare.py --stages 10: stage 10's ratios, each a median
                   over rounds, which stage 10's lesson quotes as \\s10_* aliases).
  cpu_sweep.jsonl  one JSON object per line, as the stage executables print with --json
                   (stage,title,B,H,Nq,Nk,d,causal,layout,first_ms,median_ms,gflops,
                    peak_rss_bytes,rss_before_bytes,intermediate_bytes,pass,machine,date)
Outputs: a Doxygen markdown page (anchor `results`) with tables, plots as PNG (matplotlib; tables
only when it is missing), and checks against the performance targets of the course; with
--lesson-tables, the tables the lessons show (stage07_bridge_table.txt, stage09_road_table.txt) and
the numbers they quote (lesson_numbers.doxy, Doxygen aliases).

Usage: make_results.py --gpu-csv F --cpu-jsonl F --out results.md --images DIR [--road-csv F]
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
ROAD_COLUMNS = ["kind", "impl", "step", "step_name", "dtype", "d", "N", "causal", "tflops", "gain"]
SDPA_ORDER = ["sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math"]
HALF_DTYPES = ("bf16", "fp16")
# Stage 07 beside the SDPA backends that run in 16 bits: one colour per implementation, one line
# style per dtype.
STAGE07_IMPLS = ["stage07", "sdpa_flash", "sdpa_cudnn"]
SDPA_NAMES = {
    "sdpa_flash": "SDPA flash",
    "sdpa_cudnn": "SDPA cuDNN",
    "sdpa_efficient": "SDPA efficient",
    "sdpa_math": "SDPA math",
}
# The training step: stage 07's forward and stage 09's backward ("stage09" rows of every pass; the
# deterministic dQ mode has backward rows of its own), beside SDPA flash and cuDNN. Their rows
# belong to the stage 09 section only, whatever their pass.
STAGE09_IMPLS = ["stage09", "stage09_deterministic"]
BACKWARD_SIDE = ["stage09", "stage09_deterministic", "sdpa_flash", "sdpa_cudnn"]
# Stage 11 (Hopper) beside stage 07 and the SDPA backends that run in 16 bits; its target is cuDNN.
STAGE11_IMPLS = ["stage11", "stage07", "sdpa_flash", "sdpa_cudnn"]
# Colours match stage 07's plot (ours C0, flash C1, cuDNN C2); the deterministic mode gets C3.
STAGE09_COLOURS = {"stage09": "C0", "sdpa_flash": "C1", "sdpa_cudnn": "C2", "stage09_deterministic": "C3"}


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
    if impl == "stage09_deterministic":
        return "stage 09, deterministic dQ"
    return SDPA_NAMES.get(impl, impl)


LESSON_PAGES = set()  # pages the site has (--lesson-pages): only those are linked


def impl_ref(impl):
    """A link to the lesson for our stages (when the site has the page), plain text otherwise."""
    m = re.fullmatch(r"stage(\d+)", impl)
    if m:
        return f'\\ref {impl} "stage {m.group(1)}"' if impl in LESSON_PAGES else f"stage {m.group(1)}"
    if impl == "stage09_deterministic":
        return impl_ref("stage09") + ", deterministic dQ"
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
def read_gpu(path, notes, info, rename=None):
    """The rows of a sweep CSV; `rename` maps an impl to the name it is shown under (a step of a
    road that stands for another stage in the same run) before the road's steps are left out."""
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
            raw["impl"] = (rename or {}).get((raw.get("impl") or "").strip(), raw.get("impl"))
            if re.fullmatch(r"stage\d+_step\d+", (raw.get("impl") or "").strip()):
                continue  # a step of stage 07's road: road.csv holds those, with their gains
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
                    "pass": (raw.get("pass") or "").strip() or "forward",
                    "check": (raw.get("check") or "").strip(),
                    "step": (raw.get("step") or "").strip(),
                    "step_name": (raw.get("step_name") or "").strip(),
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


def stage09_shown_step(path):
    """The renaming read_gpu() needs to show stage 09's rows: none when the sweep has rows of the
    default main kernel (impl stage09); else those of the lowest step it has (stage09_step<i> and
    its deterministic rows) under the default's names, since a sweep measured when that step was
    the default is all there is (stage09_section() names the step)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            impls = {(r.get("impl") or "").strip() for r in csv.DictReader(f)}
    except OSError:
        return None
    if "stage09" in impls:
        return None
    steps = sorted(int(m.group(1)) for m in (re.fullmatch(r"stage09_step(\d+)", i) for i in impls) if m)
    if not steps:
        return None
    shown = f"stage09_step{steps[0]}"
    return {shown: "stage09", shown + "_deterministic": "stage09_deterministic"}


def read_gpu_meta(csv_path):
    """The sweep's own record beside the CSV (gpu_sweep.json): PyTorch version, timing method, and
    the ceilings mma_ceiling measured (in the record, or in mma_ceiling.jsonl beside it)."""
    path = os.path.splitext(csv_path)[0] + ".json"
    out = {}
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
        out = {k: str(meta[k]) for k in ("gpu", "torch", "max_sm_clock_mhz", "method") if meta.get(k) not in (None, "")}
        if isinstance(meta.get("ceilings"), dict):
            out["ceilings"] = {k: v for k, v in meta["ceilings"].items() if isinstance(v, dict) and "value" in v}
        if meta.get("wgmma_ceiling_tflops"):
            out["wgmma_ceiling_tflops"] = float(meta["wgmma_ceiling_tflops"])
        if meta.get("stage11_final_step") is not None:
            out["stage11_final_step"] = int(meta["stage11_final_step"])
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    if not out.get("wgmma_ceiling_tflops"):
        try:
            with open(os.path.join(os.path.dirname(csv_path), "wgmma_ceiling.jsonl"), encoding="utf-8") as f:
                rates = {r["name"]: r for r in (json.loads(line) for line in f if line.strip())}
            out["wgmma_ceiling_tflops"] = float(rates["wgmma_ss_bf16"]["value"])
        except (OSError, ValueError, TypeError, KeyError):
            pass
    if not out.get("ceilings"):
        try:
            with open(os.path.join(os.path.dirname(csv_path), "mma_ceiling.jsonl"), encoding="utf-8") as f:
                out["ceilings"] = {r["name"]: r for r in (json.loads(line) for line in f if line.strip())}
        except (OSError, ValueError, TypeError, KeyError):
            pass
    return out


def mma_ceiling(meta, dtype="bf16"):
    """The mma.sync rate of `dtype` (bf16 or fp16) in TFLOP/s; the bf16 one when fp16's is not
    recorded (the tensor cores run both at one rate); None when neither is."""
    for name in ("mma_" + dtype, "mma_bf16"):
        try:
            return float(meta["ceilings"][name]["value"])
        except (KeyError, TypeError, ValueError):
            pass
    return None


def read_road(path, notes):
    """road.csv of bench/sdpa_compare.py: one row per stage 07 step (or SDPA flash) and shape."""
    if not os.path.exists(path):
        return None
    rows, bad = [], 0
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in ROAD_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            notes.append(f"`{os.path.basename(path)}` lacks the columns {', '.join(missing)}; it is not used.")
            return []
        for raw in reader:
            try:
                rows.append({
                    "kind": raw["kind"].strip(), "impl": raw["impl"].strip(),
                    "step": int(raw["step"]) if raw["step"].strip() else None,
                    "step_name": raw["step_name"].strip(), "idea": (raw.get("idea") or "").strip(),
                    "dtype": raw["dtype"].strip(), "d": int(raw["d"]), "N": int(raw["N"]),
                    "causal": truthy(raw["causal"]), "tflops": float(raw["tflops"]),
                    "gain": float(raw["gain"]) if raw["gain"].strip() else None,
                    "vs_cudnn": float(raw["vs_cudnn"]) if (raw.get("vs_cudnn") or "").strip() else None,
                    "gpu": (raw.get("gpu") or "").strip(), "sm_clock_mhz": (raw.get("sm_clock_mhz") or "").strip(),
                    "date": (raw.get("date") or "").strip(),
                })
            except (KeyError, ValueError, TypeError, AttributeError):
                bad += 1
    if bad:
        notes.append(f"{bad} malformed line(s) of `{os.path.basename(path)}` were skipped.")
    return rows


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
def style_tflops_against_n(ax, title):
    """The axes every TFLOP/s-against-N plot shares: N in powers of two, TFLOP/s from 0."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(pow2_label))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("TFLOP/s")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=11)
    ax.grid(True, alpha=0.3)


def finish_tflops_against_n(fig, ax, title, path):
    """The shared axes, the legend beside the plot, then the file."""
    style_tflops_against_n(ax, title)
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


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
    finish_tflops_against_n(fig, ax, title, path)


def plot_stage07(group_rows, ceiling, title, path):
    """Stage 07 and SDPA flash / cuDNN, bf16 solid and fp16 dashed, the mma.sync ceiling dotted."""
    fig, ax = plt.subplots(figsize=(8.2, 4.2), dpi=110)
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
    finish_tflops_against_n(fig, ax, title, path)


def plot_stage09(group_rows, title, path):
    """Forward + backward (left) and the backward alone (right): ours and SDPA flash / cuDNN, bf16
    solid and fp16 dashed; the deterministic backward on the right only. One legend for both."""
    names = {"stage09": "ours (stage 07 + 09)", "stage09_deterministic": "ours, deterministic dQ"}
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.3), dpi=110)
    legend = {}  # label -> (impl, dtype, line), over both panels
    for ax, pass_, heading in ((axes[0], "fwd+bwd", "forward + backward"), (axes[1], "backward", "backward alone")):
        for impl in BACKWARD_SIDE:
            for dtype in HALF_DTYPES:
                pts = sorted((r["N"], r["tflops"]) for r in group_rows
                             if r["impl"] == impl and r["dtype"] == dtype and r["pass"] == pass_)
                if not pts:
                    continue
                ours = impl.startswith("stage")
                label = f"{names.get(impl, impl_name(impl))} {dtype}"
                (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], color=STAGE09_COLOURS[impl],
                                  marker="o" if ours else "s", linestyle="-" if dtype == "bf16" else "--",
                                  linewidth=2.2 if ours else 1.4, markersize=5, label=label)
                legend.setdefault(label, (impl, HALF_DTYPES.index(dtype), line))
        style_tflops_against_n(ax, heading)
    order = sorted(legend, key=lambda k: (BACKWARD_SIDE.index(legend[k][0]), legend[k][1]))
    axes[1].legend([legend[k][2] for k in order], order, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                   borderaxespad=0)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_road(rows, title, path, sdpa="sdpa_flash"):
    """TFLOP/s step by step along the road, one line per (d, causal), the SDPA backend `sdpa` (flash
    for stage 07, cuDNN for stage 11) as the last point."""
    steps = sorted({(r["step"], r["step_name"]) for r in rows if r["kind"] == "road"})
    labels = [f"{s}: {name}" for s, name in steps] + [SDPA_NAMES.get(sdpa, sdpa)]
    fig, ax = plt.subplots(figsize=(8.2, 4.4), dpi=110)
    for i, (d, causal) in enumerate(sorted({(r["d"], r["causal"]) for r in rows})):
        cell = {r["step"]: r["tflops"] for r in rows if r["kind"] == "road" and (r["d"], r["causal"]) == (d, causal)}
        flash = [r["tflops"] for r in rows if r["kind"] == "sdpa" and r["impl"] in (sdpa, "") and (r["d"], r["causal"]) == (d, causal)]
        xs = [k for k, (s, _) in enumerate(steps) if s in cell]
        ax.plot(xs, [cell[steps[k][0]] for k in xs], color=f"C{i}", marker="o",
                linestyle="-" if not causal else "--", label=f"d = {d}, {'causal' if causal else 'non-causal'}")
        if flash:
            ax.plot([len(steps)], flash[:1], color=f"C{i}", marker="s", linestyle="none")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("TFLOP/s")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=9, loc="upper left")
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
        # Groups where our stages ran come first; then the ones with SDPA alone. The 16-bit dtypes
        # stage 07 ran in have their own section (stage07_section), beside flash and cuDNN.
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


def verdict(ratios, ok, worst_is_max, what="shapes"):
    """'met', or 'not met at K of M shapes (worst: ...)'."""
    failing = [(key, r) for key, r in ratios if not ok(r)]
    if not failing:
        return "met"
    key, r = (max if worst_is_max else min)(failing, key=lambda kr: kr[1])
    return f"**not met** at {len(failing)} of {len(ratios)} {what} (worst {fmt_num(r)} at {shape_text(key)})"


def target_row(label, goal, ratios, ok, worst_is_max=False, unit="×", what="shapes"):
    """A row of a targets table: the span and median of `ratios` ((key, ratio) pairs) and the verdict."""
    lo, med, hi = ratio_summary(ratios)
    return (f"| {label} | {goal} | {fmt_num(lo)}{unit} to {fmt_num(hi)}{unit} (median {fmt_num(med)}{unit}, "
            f"{len(ratios)} {what}) | {verdict(ratios, ok, worst_is_max, what)} |")


def targets_table(lines, out):
    """The rows of a targets table under its header, then a blank line; nothing without rows."""
    if lines:
        out.extend(["| target | goal | measured | verdict |", "|---|---|---|---|", *lines, ""])


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
    for stage in sorted({r["impl"] for r in rows if re.fullmatch(r"stage(0[7-9]|[1-9]\d)", r["impl"])}, key=impl_key):
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


# ----------------------------------------------------------------------------- stage 07 section
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


def stage07_section(rows, meta, road, images, out, plots_made):
    """Stage 07 in bf16 and fp16 beside SDPA flash and cuDNN in the same dtypes; the ratios; the road."""
    w = out.append
    w("## GPU: stage 07 on the tensor cores beside SDPA flash and cuDNN {#results_stage07}")
    w("")
    ours = [r for r in rows or [] if r["impl"] == "stage07" and r["dtype"] in HALF_DTYPES]
    ceiling = mma_ceiling(meta)
    if not ours:
        w("\\note The stage 07 figures have not been measured yet: `docs/results/gpu_sweep.csv` has no stage 07 "
          "rows. `bench/gpu_session.sh sweep07` measures them in bf16 and fp16 beside SDPA's flash and cuDNN "
          "backends, and `bench/gpu_session.sh road` measures each step of its road.")
        w("")
    else:
        dtypes, side, gpus = side_by_side(rows, ours, STAGE07_IMPLS)
        w(f"Stage 07 runs in bf16 and fp16 (float32 accumulation) on the tensor cores; SDPA's flash and cuDNN "
          f"backends ran on the same shapes in the same dtypes, in the same sweep. Measured on **{md(', '.join(gpus))}**, "
          f"SM clock {span((r['sm_clock_mhz'] for r in side), 'MHz')}, {span(r['date'] for r in side)}.")
        w("")
        ceilings_table(meta, out)
        for gpu, d, mask, anchor, g in gpu_sections(side, "results_stage07", gpus, w):
            if HAVE_MPL:
                name = f"{anchor}.png"
                plot_stage07(g, ceiling, f"{gpu}: stage 07 and SDPA, d = {d}, {mask}", os.path.join(images, name))
                plots_made.append(name)
                w(f'\\image html {name} "TFLOP/s against N, bf16 and fp16, d = {d}, {mask}"')
                w("")
            tflops_table(g, dtypes, STAGE07_IMPLS, w)
        stage07_ratios(side, dtypes, meta, out)
    road_section(road, ceiling, images, out, plots_made)


def ceilings_table(meta, out):
    """The peak rates mma_ceiling measured on the GPU of the sweep, when the record has them."""
    names = {"mma_bf16": "`mma.sync` m16n8k16 bf16", "mma_fp16": "`mma.sync` m16n8k16 fp16",
             "ex2": "`ex2.approx.ftz.f32`", "ffma": "fp32 FMA"}
    ceilings = meta.get("ceilings") or {}
    lines = [f"| {names.get(k, md(k))} | {fmt_num(float(v['value']))} {md(v.get('unit', ''))} | "
             f"{md(v.get('sm_clock_mhz', ''))} MHz |" for k, v in ceilings.items() if k in names]
    if not lines:
        return
    out.append("Ceilings of the same GPU, measured by `bench/mma_ceiling.cu` (one instruction issued back to back "
               "from registers on every SM):")
    out.append("")
    out.append("| instruction | rate | SM clock |")
    out.append("|---|---:|---:|")
    out.extend(lines)
    out.append("")


def stage07_ratios(side, dtypes, meta, out):
    """Per dtype: stage 07 / SDPA flash and / cuDNN at every shape, and the fraction of the ceiling."""
    w = out.append
    w("### Stage 07 against SDPA {#results_stage07_ratios}")
    w("")
    idx = {(r["gpu"], r["impl"], r["dtype"], r["N"], r["d"], r["causal"]): r for r in side}
    for t in dtypes:
        ceiling = mma_ceiling(meta, t)
        shapes = sorted({(r["gpu"], r["d"], r["causal"]) for r in side if r["dtype"] == t and r["impl"] == "stage07"})
        sizes = sorted({r["N"] for r in side if r["dtype"] == t and r["impl"] == "stage07"})
        w(f"{t}: stage 07 / SDPA flash, with stage 07 / SDPA cuDNN in parentheses"
          + (f" and the fraction of the `mma.sync` {t} ceiling below" if ceiling else "") + ".")
        w("")
        w("| d | mask | " + " | ".join(f"N = {n}" for n in sizes) + " |")
        w("|---:|---|" + "---:|" * len(sizes))
        for gpu, d, causal in shapes:
            cells = []
            for n in sizes:
                r = idx.get((gpu, "stage07", t, n, d, causal))
                fl, cu = idx.get((gpu, "sdpa_flash", t, n, d, causal)), idx.get((gpu, "sdpa_cudnn", t, n, d, causal))
                if not r:
                    cells.append("–")
                    continue
                text = f"{fmt_num(r['tflops'] / fl['tflops'])}×" if fl else "–"
                low = fl is not None and r["tflops"] < fl["tflops"]
                text = f"**{text}**" if low else text  # below the target (1.0x flash): in bold
                text += f" ({fmt_num(r['tflops'] / cu['tflops'])}×)" if cu else ""
                if ceiling:
                    text += f"<br>{100 * r['tflops'] / ceiling:.0f}%"
                cells.append(text)
            w(f"| {d} | {'causal' if causal else 'non-causal'} | " + " | ".join(cells) + " |")
        w("")
    w("Bold: below SDPA flash, the course's target for stage 07 (≥ 1.0×, aim 1.2×).")
    w("")


def side_by_side(rows, ours, impls):
    """The rows of `impls` measured on the shapes (GPU, dtype, B, H, N, d, causal) where `ours` was:
    the dtypes of ours, those rows, and their GPUs."""
    dtypes = [t for t in HALF_DTYPES if any(r["dtype"] == t for r in ours)]
    shape = lambda r: (r["gpu"], r["dtype"], r["B"], r["H"], r["N"], r["d"], r["causal"])
    shapes_of = {shape(r) for r in ours}
    side = [r for r in rows if r["impl"] in impls and r["dtype"] in dtypes and shape(r) in shapes_of]
    return dtypes, side, sorted({r["gpu"] for r in side})


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
        if HAVE_MPL and any(r["kind"] == "road" for r in at_n):
            name = f"{anchor}.png"
            plot_road(at_n, f"stage {number} step by step, {dtype}, N = {n}", os.path.join(images, name),
                      **({"sdpa": "sdpa_cudnn"} if vs_cudnn else {}))
            plots_made.append(name)
            w(f'\\image html {name} "TFLOP/s of each step of stage {number}\'s road, {dtype}, N = {n}"')
            w("")
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


def road_section(road, ceiling, images, out, plots_made):
    """Stage 07's road from road.csv: TFLOP/s of each step and its gain over the step before."""
    w = out.append
    w("### The road of stage 07 {#results_stage07_road}")
    w("")
    if not road:
        w("\\note The road has not been measured yet: `docs/results/road.csv` is not there. "
          "`bench/gpu_session.sh road` times every step of stage 07 (and the candidate tile shapes of the "
          "tuning build) and writes it.")
        w("")
        return
    dtype = "bf16" if any(r["dtype"] == "bf16" for r in road) else road[0]["dtype"]
    rows = [r for r in road if r["dtype"] == dtype]
    w(f"Each step switches on one more feature of the kernel; {dtype}, measured on **{md(span(r['gpu'] for r in rows))}**, "
      f"SM clock {span((r['sm_clock_mhz'] for r in rows), 'MHz')}, {span(r['date'] for r in rows)}. Cells: TFLOP/s, "
      "with the gain over the step before (× < 1 in bold: the step made this shape slower). Tuning candidates are "
      "compared with the final kernel instead.")
    w("")
    road_tables(rows, dtype, "stage07", ("road", "candidate", "sdpa"), images, out, plots_made)

# ----------------------------------------------------------------------------- stage 11 section
def read_first_contact(path):
    """The first timings of stage 11 in bench/hopper_first_contact.sh's record: one dict per
    `stage11_hopper_kernel --step S ... --bench` run (step, step name, d, causal, N, TFLOP/s, ms),
    the wgmma ceilings it measured, and the GPU line; None when the file is not there."""
    if not os.path.exists(path):
        return None
    runs, ceilings, gpu, cmd = [], {}, "", None
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("name, compute_cap") and i + 1 < len(lines):
            gpu = lines[i + 1].split(",")[0].strip()
        m = re.match(r"(wgmma_\w+)\s+([\d.]+) TFLOP/s", line)
        if m:
            ceilings[m.group(1)] = float(m.group(2))
        if line.startswith("$ ") and "stage11_hopper_kernel" in line and "--bench" in line:
            cmd = {"step": re.search(r"--step (\d+)", line), "d": re.search(r"--head-dim (\d+)", line),
                   "N": re.search(r"--seq-q (\d+)", line), "causal": " --causal" in line, "name": ""}
            continue
        if cmd is not None and line.startswith("config"):
            m = re.search(r"step \d+ \(([^)]*)\)", line)
            cmd["name"] = m.group(1) if m else ""
        if cmd is not None and line.startswith("bench"):
            m = re.search(r"median ([\d.]+) ms.*: ([\d.]+) TFLOP/s", line)
            if m and cmd["step"] and cmd["d"] and cmd["N"]:
                runs.append({"step": int(cmd["step"].group(1)), "step_name": cmd["name"], "d": int(cmd["d"].group(1)),
                             "N": int(cmd["N"].group(1)), "causal": cmd["causal"], "median_ms": float(m.group(1)),
                             "tflops": float(m.group(2))})
        if line.startswith("[exit"):
            cmd = None
    return {"gpu": gpu, "runs": runs, "ceilings": ceilings}


def stage11_section(rows, meta, road11, first_contact, groups_table, images, out, plots_made):
    """Stage 11 (Hopper) beside stage 07, SDPA flash and cuDNN from gpu_sweep.csv; its ratios to cuDNN
    (the target) and flash; its road from road11.csv. Until the sweep has stage 11, the first timings
    of bench/hopper_first_contact.sh when they are committed."""
    w = out.append
    w("## GPU: stage 11 on Hopper beside stage 07, SDPA flash and cuDNN {#results_stage11}")
    w("")
    w("Every run behind this section, round by round, and the tries that lost: \\ref stage11_record.")
    w("")
    ours = [r for r in rows or [] if r["impl"] == "stage11" and r["dtype"] in HALF_DTYPES]
    wgmma = meta.get("wgmma_ceiling_tflops")
    if not ours:
        w("\\note Stage 11 has not been swept yet: `docs/results/gpu_sweep.csv` has no stage 11 rows. "
          "`bench/sdpa_compare.py --stages 07 11` measures it in bf16 and fp16 beside stage 07 and SDPA's flash and "
          "cuDNN backends (`bench/gpu_session.sh quick` with `QUICK_STAGES=\"07 11\"`), and "
          "`bench/gpu_session.sh road11` times every step of its road.")
        w("")
        first_contact_table(first_contact, out)
    else:
        dtypes, side, gpus = side_by_side(rows, ours, STAGE11_IMPLS)
        w(f"Stage 11 runs in bf16 and fp16 (float32 accumulation) with Hopper's `wgmma`, the TMA and warp "
          f"specialization; stage 07 and SDPA's flash and cuDNN backends ran on the same shapes in the same dtypes, in "
          f"the same sweep. Measured on **{md(', '.join(gpus))}**, SM clock "
          f"{span((r['sm_clock_mhz'] for r in side), 'MHz')}, {span(r['date'] for r in side)}."
          + (f" The dense `wgmma` bf16 ceiling of `bench/wgmma_ceiling.cu` on this GPU: {fmt_num(wgmma)} TFLOP/s."
             if wgmma else "")
          + (f" The rows named stage 11 are step {meta['stage11_final_step']} of its road, the default of the build that "
             f"measured them; its record times every step of the road (\\ref stage11_measured)."
             if meta.get("stage11_final_step") is not None else ""))
        w("")
        for gpu, d, mask, anchor, g in gpu_sections(side, "results_stage11", gpus, w):
            tflops_table(g, dtypes, STAGE11_IMPLS, w)
        stage11_ratios(side, dtypes, wgmma, out)
    road11_section(road11, images, out, plots_made)
    earlier_sweep11_section(os.path.join(os.path.dirname(groups_table), "stage11_sweep_h100_table.txt"), out)
    groups11_section(groups_table, out)
    if ours:
        first_contact_table(first_contact, out)


def earlier_sweep11_section(path, out):
    """Stage 11's default on another GPU (an earlier sweep, kept as bench/sdpa_compare.py printed it)."""
    if not os.path.exists(path):
        return
    w = out.append
    w("### The default on an H100 {#results_stage11_h100}")
    w("")
    w("The same kernel on an H100 80GB HBM3 the day before the sweep above, two rounds and four sizes "
      "(`docs/results/stage11_sweep_h100_table.txt`, with its CSV `stage11_sweep_h100.csv`), as written:")
    w("")
    verbatim_file(path, out)


def verbatim_file(path, out):
    """A record of docs/results/ shown on the page as it was written, in a fenced block."""
    out.append("~~~")
    with open(path, encoding="utf-8") as f:
        out.extend(line.rstrip("\n") for line in f)
    out.extend(["~~~", ""])


def groups11_section(path, out):
    """Stage 11's causal block order with several L2 budgets per group of heads (the table
    bench/gpu_session.sh groups11 writes), shown as it was measured."""
    w = out.append
    w("### The block order of step 6: groups of heads {#results_stage11_groups}")
    w("")
    if not os.path.exists(path):
        w("\\note Not measured yet: `bench/gpu_session.sh groups11` times step 6 with several L2 budgets per group "
          "of heads beside step 5 and writes `docs/results/stage11_groups_table.txt`.")
        w("")
        return
    w("Under a causal mask, step 5 runs the heads one after the other, each from its heaviest query tile; step 6 "
      "takes the heads in groups whose K and V fit an L2 budget and runs each group rank by rank, heaviest first. "
      "`bench/gpu_session.sh groups11` times step 6 with several budgets (`FA_STAGE11_GROUP_MIB`; *all*: one group "
      "of every head) beside step 5, bf16, median of 20 runs each; the course's default budget is the one with the "
      "best geometric mean. `docs/results/stage11_groups_table.txt`, as written:")
    w("")
    verbatim_file(path, out)


def first_contact_table(first_contact, out):
    """The first timings of every step of stage 11 (bench/hopper_first_contact.sh), one column per
    (d, causal), step 0 being stage 07's final kernel."""
    w = out.append
    if not first_contact or not first_contact["runs"]:
        w("No timing of stage 11 is committed yet (`docs/results/stage11_first_contact.txt`, written by "
          "`bench/hopper_first_contact.sh`).")
        w("")
        return
    runs = first_contact["runs"]
    w(f"### First timings {{#results_stage11_first_contact}}")
    w("")
    w(f"The first timings of stage 11, taken before the side-by-side runs above existed, from `bench/hopper_first_contact.sh` "
      f"(`docs/results/stage11_first_contact.txt`, and `stage11_first_contact_road.txt` for the later steps and timings taken again) on **{md(first_contact['gpu'] or 'the GPU of the record')}**: "
      f"bf16, N = {', '.join(str(n) for n in sorted({r['N'] for r in runs}))}, each step of the road timed alone "
      "(median of its runs, CUDA events), without SDPA beside it. Step 0 is stage 07's final kernel.")
    w("")
    cols = sorted({(r["d"], r["causal"]) for r in runs})
    cell = {(r["step"], r["d"], r["causal"]): r for r in runs}
    names = OrderedDict((r["step"], r["step_name"]) for r in sorted(runs, key=lambda r: r["step"]))
    w("| step | name | " + " | ".join(f"d = {d}, {'causal' if c else 'non-causal'}" for d, c in cols) + " |")
    w("|---:|---|" + "---:|" * len(cols))
    for step, name in names.items():
        cells = []
        for d, c in cols:
            r, before = cell.get((step, d, c)), cell.get((step - 1, d, c))
            text = fmt_num(r["tflops"]) if r else "–"
            if r and before:
                gain = r["tflops"] / before["tflops"]
                text += f" (**×{fmt_num(gain)}**)" if gain < 1.0 else f" (×{fmt_num(gain)})"
            cells.append(text)
        w(f"| {step} | {md(name)} | " + " | ".join(cells) + " |")
    w("")
    ceilings = first_contact["ceilings"]
    if ceilings:
        w("Cells: TFLOP/s (× gain over the step before; below 1 in bold). The same record's `wgmma` ceilings "
          "(`bench/wgmma_ceiling.cu`): " + ", ".join(f"`{k}` {fmt_num(v)} TFLOP/s" for k, v in ceilings.items()) + ".")
    else:
        w("Cells: TFLOP/s (× gain over the step before; below 1 in bold).")
    w("")


def stage11_ratios(side, dtypes, wgmma, out):
    """Per dtype: stage 11 / SDPA cuDNN at every shape (the target), with / flash and / stage 07."""
    w = out.append
    w("### Stage 11 against SDPA cuDNN {#results_stage11_ratios}")
    w("")
    idx = {(r["gpu"], r["impl"], r["dtype"], r["N"], r["d"], r["causal"]): r for r in side}
    ratios = []
    for t in dtypes:
        shapes = sorted({(r["gpu"], r["d"], r["causal"]) for r in side if r["dtype"] == t and r["impl"] == "stage11"})
        sizes = sorted({r["N"] for r in side if r["dtype"] == t and r["impl"] == "stage11"})
        w(f"{t}: stage 11 / SDPA cuDNN, with stage 11 / SDPA flash and stage 11 / stage 07 in parentheses"
          + (" and the fraction of the dense `wgmma` bf16 ceiling below" if wgmma else "") + ".")
        w("")
        w("| d | mask | " + " | ".join(f"N = {n}" for n in sizes) + " |")
        w("|---:|---|" + "---:|" * len(sizes))
        for gpu, d, causal in shapes:
            cells = []
            for n in sizes:
                r = idx.get((gpu, "stage11", t, n, d, causal))
                cu, fl, s7 = (idx.get((gpu, i, t, n, d, causal)) for i in ("sdpa_cudnn", "sdpa_flash", "stage07"))
                if not r:
                    cells.append("–")
                    continue
                text = f"{fmt_num(r['tflops'] / cu['tflops'])}×" if cu else "–"
                if cu:
                    ratios.append(((t, n, d, causal), r["tflops"] / cu["tflops"]))
                    text = f"**{text}**" if r["tflops"] < cu["tflops"] else text  # below the target: bold
                inner = [f"{fmt_num(r['tflops'] / x['tflops'])}×" for x in (fl, s7) if x]
                text += f" ({', '.join(inner)})" if inner else ""
                if wgmma:
                    text += f"<br>{100 * r['tflops'] / wgmma:.0f}%"
                cells.append(text)
            w(f"| {d} | {'causal' if causal else 'non-causal'} | " + " | ".join(cells) + " |")
        w("")
    w("Bold: below SDPA cuDNN, the course's target for stage 11 (≥ 1.0×).")
    w("")
    if ratios:
        targets_table([target_row(f"{impl_ref('stage11')} {'/'.join(dtypes)} / SDPA cuDNN", "≥ 1.0×", ratios,
                                  lambda r: r >= 1.0)], out)


def road11_section(road, images, out, plots_made):
    """Stage 11's road from road11.csv: each step's TFLOP/s, its gain over the step before and its
    ratio to SDPA cuDNN."""
    w = out.append
    w("### The road of stage 11 {#results_stage11_road}")
    w("")
    if not road:
        w("\\note The road of stage 11 has not been swept yet: `docs/results/road11.csv` is not there. "
          "`bench/gpu_session.sh road11` times every step beside stage 07, SDPA flash and cuDNN and writes it.")
        w("")
        return
    dtype = "bf16" if any(r["dtype"] == "bf16" for r in road) else road[0]["dtype"]
    rows = [r for r in road if r["dtype"] == dtype]
    w(f"Each step adds one idea to the kernel; step 0 is stage 07's final kernel. {dtype}, measured on "
      f"**{md(span(r['gpu'] for r in rows))}**, SM clock {span((r['sm_clock_mhz'] for r in rows), 'MHz')}, "
      f"{span(r['date'] for r in rows)}. Cells: TFLOP/s, the gain over the step before (× < 1 in bold: the step made "
      "this shape slower), and the ratio to SDPA cuDNN after the slash.")
    w("")
    road_tables(rows, dtype, "stage11", ("road", "sdpa"), images, out, plots_made, vs_cudnn=True)


# ----------------------------------------------------------------------------- stage 09 section
def stage09_section(rows, images, out, plots_made):
    """The training step: stage 07's forward + stage 09's backward beside SDPA flash and cuDNN, forward
    + backward timed as one pair and the backward alone; the ratios; what deterministic dQ costs."""
    w = out.append
    w("## GPU: the training step, stage 07 forward + stage 09 backward beside SDPA {#results_stage09}")
    w("")
    w("Every run behind this section, round by round, and the tries that lost: \\ref stage09_record.")
    w("")
    ours = [r for r in rows or [] if r["impl"] in STAGE09_IMPLS and r["dtype"] in HALF_DTYPES]
    if not ours:
        w("\\note The backward has not been measured yet: `docs/results/gpu_sweep.csv` has no stage 09 rows. "
          "`bench/gpu_session.sh sweep09` times stage 07's forward and stage 09's backward in bf16 and fp16 beside "
          "SDPA's flash and cuDNN backends (forward, backward, and the two together).")
        w("")
        return
    shapes_of = {(r["gpu"], r["dtype"], r["B"], r["H"], r["N"], r["d"], r["causal"]) for r in ours}
    side = [r for r in rows if r["impl"] in BACKWARD_SIDE and r["pass"] in ("backward", "fwd+bwd")
            and (r["gpu"], r["dtype"], r["B"], r["H"], r["N"], r["d"], r["causal"]) in shapes_of]
    dtypes = [t for t in HALF_DTYPES if any(r["dtype"] == t for r in ours)]
    gpus = sorted({r["gpu"] for r in side})
    steps = sorted({str(r.get("step") or "") for r in ours})
    w(f"Measured on **{md(', '.join(gpus))}**, SM clock {span((r['sm_clock_mhz'] for r in side), 'MHz')}, "
      f"{span(r['date'] for r in side)}. "
      + (f"Stage 09's rows are step {', '.join(steps)} of its road (`{md(ours[0].get('step_name') or '')}`), the default "
         "main kernel when they were measured; the lesson gives the default of today beside SDPA "
         "(\\ref stage09_sweep). " if steps and steps != [""] else "")
      + "Ours: stage 07's final kernel as the forward (it writes the O and LSE the "
      "backward reads) and stage 09's three backward kernels, dQ added across key blocks with float32 atomics or, "
      "with deterministic dQ, in a fixed order. SDPA: the backward alone is `torch.autograd.grad(o, (q, k, v), do)` "
      "after one forward. Forward + backward is timed as one pair on both sides (CUDA events around both, the L2 "
      "flushed before the pair). TFLOP/s count 2.5 times the forward's \\f$4 B H N^2 d\\f$ for the backward and 3.5 "
      "times for the pair (halved for causal attention): fa::attention_flops_backward(), fa::attention_flops_fwd_bwd().")
    w("")
    bad = [r for r in ours if r["check"] == "BAD"]
    if bad:
        w(f"\\warning {len(bad)} stage 09 row(s) failed bench_gpu's gross-error guard (marked **BAD**): their "
          "gradients are not to be trusted.")
        w("")
    cols = [("stage09", "fwd+bwd"), ("sdpa_flash", "fwd+bwd"), ("sdpa_cudnn", "fwd+bwd"),
            ("stage09", "backward"), ("stage09_deterministic", "backward"), ("sdpa_flash", "backward"),
            ("sdpa_cudnn", "backward")]
    heads = {("stage09", "fwd+bwd"): "ours fwd+bwd", ("stage09", "backward"): "ours bwd",
             ("stage09_deterministic", "backward"): "ours bwd, det. dQ"}
    for gpu, d, mask, anchor, g in gpu_sections(side, "results_stage09", gpus, w):
        if HAVE_MPL:
            name = f"{anchor}.png"
            plot_stage09(g, f"{gpu}: training step, d = {d}, {mask}", os.path.join(images, name))
            plots_made.append(name)
            w(f'\\image html {name} "TFLOP/s against N: forward + backward, and the backward alone, d = {d}, {mask}"')
            w("")
        cell = {(r["N"], r["B"], r["H"], r["dtype"], r["impl"], r["pass"]): r for r in g}
        for t in dtypes:
            w(f"{t}:")
            w("")
            w("| N | B | H | " + " | ".join(heads.get(c) or f"{impl_ref(c[0])} {'fwd+bwd' if c[1] == 'fwd+bwd' else 'bwd'}"
                                           for c in cols) + " |")
            w("|---:|---:|---:|" + "---:|" * len(cols))
            for n, b, h in sorted({(r["N"], r["B"], r["H"]) for r in g if r["dtype"] == t}):
                cells = []
                for impl, pass_ in cols:
                    r = cell.get((n, b, h, t, impl, pass_))
                    text = f"{fmt_num(r['tflops'])} ({fmt_num(r['median_ms'])} ms)" if r else "–"
                    cells.append(text + (" **BAD**" if r and r["check"] == "BAD" else ""))
                w(f"| {n} | {b} | {h} | " + " | ".join(cells) + " |")
            w("")
        w("Cells: TFLOP/s (median time); – where a backend has no kernel for the dtype or shape.")
        w("")
    stage09_ratios(side, dtypes, out)


def road09_section(road09, out):
    """Stage 09's road on the results page: the table its lesson shows, per dtype of the record."""
    w = out.append
    w("### The road of stage 09 {#results_stage09_road}")
    w("")
    if not road09:
        w("\\note The road has not been measured yet: `docs/results/stage09_steps_quick.txt` is not there. "
          "`QUICK_STAGES=\"07 09\" STEPS09=\"1 2 3\" bench/gpu_session.sh quick` times every main kernel of stage 09 "
          "beside the default one and SDPA flash.")
        w("")
        return
    for t in [t for t in HALF_DTYPES if any(r["dtype"] == t for r in road09["rows"])]:
        w("~~~")
        out.extend(stage09_road_table(road09, os.devnull, t))
        w("~~~")
        w("")


def stage09_ratios(side, dtypes, out):
    """Per dtype: ours / SDPA flash (and / cuDNN) forward + backward and backward alone, at every shape;
    then the deterministic backward's time over the atomic one's."""
    w = out.append
    w("### The training step against SDPA {#results_stage09_ratios}")
    w("")
    idx = {(r["gpu"], r["impl"], r["pass"], r["dtype"], r["N"], r["d"], r["causal"]): r for r in side}
    for t in dtypes:
        shapes = sorted({(r["gpu"], r["d"], r["causal"]) for r in side if r["dtype"] == t and r["impl"] == "stage09"})
        sizes = sorted({r["N"] for r in side if r["dtype"] == t and r["impl"] == "stage09"})
        w(f"{t}: ours / SDPA flash, with ours / SDPA cuDNN in parentheses: forward + backward (f+b), and below it "
          "the backward alone (bwd).")
        w("")
        w("| d | mask | " + " | ".join(f"N = {n}" for n in sizes) + " |")
        w("|---:|---|" + "---:|" * len(sizes))
        for gpu, d, causal in shapes:
            cells = []
            for n in sizes:
                parts = []
                for pass_, short in (("fwd+bwd", "f+b"), ("backward", "bwd")):
                    r = idx.get((gpu, "stage09", pass_, t, n, d, causal))
                    fl = idx.get((gpu, "sdpa_flash", pass_, t, n, d, causal))
                    cu = idx.get((gpu, "sdpa_cudnn", pass_, t, n, d, causal))
                    if not r:
                        parts.append(f"{short} –")
                        continue
                    text = f"{fmt_num(r['tflops'] / fl['tflops'])}×" if fl else "–"
                    text = f"**{text}**" if fl and r["tflops"] < fl["tflops"] else text  # slower than SDPA flash
                    parts.append(f"{short} {text}" + (f" ({fmt_num(r['tflops'] / cu['tflops'])}×)" if cu else ""))
                cells.append("<br>".join(parts))
            w(f"| {d} | {'causal' if causal else 'non-causal'} | " + " | ".join(cells) + " |")
        w("")
    w("Bold: slower than SDPA flash.")
    w("")
    det = [(r, idx.get((r["gpu"], "stage09", "backward", r["dtype"], r["N"], r["d"], r["causal"])))
           for r in side if r["impl"] == "stage09_deterministic" and r["pass"] == "backward"]
    det = [(r, a) for r, a in det if a and a["median_ms"] > 0]
    if not det:
        return
    sizes = sorted({r["N"] for r, _ in det})
    w("What deterministic dQ costs: the backward's time with dQ added in a fixed order over its time with atomic "
      "additions.")
    w("")
    w("| dtype | d | mask | " + " | ".join(f"N = {n}" for n in sizes) + " |")
    w("|---|---:|---|" + "---:|" * len(sizes))
    cell = {(r["dtype"], r["d"], r["causal"], r["N"]): r["median_ms"] / a["median_ms"] for r, a in det}
    for t, d, causal in sorted({k[:3] for k in cell}, key=lambda k: (HALF_DTYPES.index(k[0]), k[1], k[2])):
        cells = [f"{fmt_num(cell[(t, d, causal, n)])}×" if (t, d, causal, n) in cell else "–" for n in sizes]
        w(f"| {t} | {d} | {'causal' if causal else 'non-causal'} | " + " | ".join(cells) + " |")
    w("")


# ----------------------------------------------------------------------------- stage 10 section
# Stage 10's switches against SDPA (stage10.csv): the variants in the order of the lesson, the passes
# in the order of the tables, the colours of the plots (ours C0, flash C1 and cuDNN C2 as in the
# sections above; efficient C4), and the course's targets for stage 10.
STAGE10_VARIANTS = ["gqa8", "gqa4", "causal", "dropout0.1"]
PASSES = ["forward", "fwd+bwd", "backward"]
PASS_NAMES = {"forward": "forward", "fwd+bwd": "forward + backward", "backward": "backward alone"}
STAGE10_LAYOUTS = {"varlen": "nested", "padded": "padded"}  # SDPA's two ways to batch mixed lengths
STAGE10_COLOURS = {"stage10": "C0", "sdpa_flash": "C1", "sdpa_cudnn": "C2", "sdpa_efficient": "C4"}
PASS_COLOURS = {"forward": "C0", "fwd+bwd": "C9", "backward": "C7"}
STAGE10_PACKED_OVER_DENSE = 0.95  # the packed batch's rate over the dense kernel's on a uniform batch
STAGE10_WINDOW_TARGET, STAGE10_WINDOW_TARGET_N = 0.35, 16384  # a window's time over causal, at this N


def read_stage10(path, notes):
    """stage10.csv (bench/sdpa_compare.py --stages 10): one dict per row, sizes and rounds as ints,
    measures as floats or None where empty (an SDPA backend without a kernel for the case: the note
    says why); None when the file is not there."""
    if not os.path.exists(path):
        return None
    number = lambda text: float(text) if (text or "").strip() else None
    rows, bad = [], 0
    with open(path, newline="", encoding="utf-8") as f:
        for raw in csv.DictReader(f):
            try:
                row = {k: raw[k].strip() for k in ("kind", "variant", "ours", "other", "pass", "dtype", "gpu", "date")}
                row.update({k: int(raw[k]) for k in ("d", "N", "B", "H")})
                row["rounds"] = int(raw["rounds"] or 0)
                row.update({k: number(raw[k]) for k in ("value", "lo", "hi", "ours_ms", "other_ms", "ours_tflops",
                                                        "other_tflops")})
                row["note"] = (raw.get("note") or "").strip()
                rows.append(row)
            except (KeyError, ValueError, TypeError, AttributeError):
                bad += 1
    if bad:
        notes.append(f"{bad} malformed line(s) of `{os.path.basename(path)}` were skipped.")
    return rows


def sdpa_backend(other):
    """'sdpa_flash_gqa8' -> ('sdpa_flash', 'gqa8'); a name of ours -> (name, '')."""
    m = re.fullmatch(r"(sdpa_[a-z]+)_(.+)", other)
    return (m.group(1), m.group(2)) if m else (other, "")


def variant_name(variant):
    """'gqa8' -> 'grouped 8:1', 'dropout0.1' -> 'dropout 0.1', 'window4095' -> 'window (4095, 0)'."""
    for pattern, name in ((r"gqa(\d+)", "grouped {}:1"), (r"dropout([\d.]+)", "dropout {}"),
                          (r"window(\d+)", "window ({}, 0)"), (r"causal", "plain causal")):
        m = re.fullmatch(pattern, variant)
        if m:
            return name.format(*m.groups())
    return variant


def variant_key(variant):
    return (STAGE10_VARIANTS.index(variant) if variant in STAGE10_VARIANTS else len(STAGE10_VARIANTS), variant)


def window_share(n, left, right=0):
    """The (query, key) pairs a window (left, right) keeps of one causal sequence of n tokens, over
    the causal pairs: query i sees keys max(0, i - left) to i + min(right, 0)."""
    kept = sum(i + min(right, 0) - max(0, i - left) + 1 for i in range(n))
    return kept / (n * (n + 1) // 2)


def ratio_cell(r, bold_below=None):
    """'1.07× [1.06–1.07]': the median over the rounds and the smallest and largest; the median in
    bold below `bold_below`; – without a value."""
    if not r or r["value"] is None:
        return "–"
    text = f"{fmt_num(r['value'])}×"
    if bold_below is not None and r["value"] < bold_below:
        text = f"**{text}**"
    if r["lo"] is not None and r["hi"] is not None:
        # A word joiner after the dash: a narrow column breaks the cell before the span, not inside it.
        text += f" [{fmt_num(r['lo'])}–\u2060{fmt_num(r['hi'])}]"
    return text


def point_key(p):
    """(dtype, d, N, ...) in the order of the tables: bf16 before fp16, then d, then N."""
    return (HALF_DTYPES.index(p[0]) if p[0] in HALF_DTYPES else len(HALF_DTYPES),) + tuple(p)


def lesson_ref(anchor, page="stage10"):
    """' (\\ref anchor)' when the site has the lesson `page`, else nothing."""
    return f" (\\ref {anchor})" if page in LESSON_PAGES else ""


def passes_of(rows):
    return [p for p in PASSES if any(r["pass"] == p for r in rows)]


def count_text(values, ok):
    """'5 of 8 points (0.93× to 1.17×)': how many of the values pass `ok`, and the span of all."""
    if not values:
        return "no point"
    k, n = sum(1 for v in values if ok(v)), len(values)
    count = f"none of {n} points" if k == 0 else f"all {n} points" if k == n else f"{k} of {n} points"
    return f"{count} ({fmt_num(min(values))}× to {fmt_num(max(values))}×)"


def refused_text(rows):
    """The cases SDPA ran no kernel for (an empty value), one phrase per backend and case."""
    cases = OrderedDict()
    for r in sorted(rows, key=lambda r: (r["other"], PASSES.index(r["pass"]) if r["pass"] in PASSES else 9)):
        if r["value"] is None:
            backend, case = sdpa_backend(r["other"])
            case = f"a {STAGE10_LAYOUTS[case]} batch" if case in STAGE10_LAYOUTS else variant_name(case)
            name = f"{backend[len('sdpa_'):]} with {case}"
            cases.setdefault(name, set()).add(r["pass"])
    if not cases:
        return ""
    return ("SDPA has no kernel for " + "; ".join(f"{name} ({', '.join(p for p in PASSES if p in ps)})"
                                                   for name, ps in cases.items())
            + "; `stage10.csv` keeps PyTorch's reason in its `note` column.")


def style_groups(ax, labels):
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_xlim(-0.6, len(labels) - 0.4)
    ax.grid(True, axis="y", alpha=0.3)


def plot_stage10_ratios(idx, variants, points, passes, backend, title, path):
    """Ours / SDPA `backend` by rate, one panel per pass: at each (dtype, d, N) point a dot per
    variant, the median over the rounds with the smallest and largest as its bar; a line at 1.0."""
    fig, axes = plt.subplots(len(passes), 1, figsize=(9.5, 2.3 * len(passes) + 1.0), dpi=110, sharex=True,
                             sharey=True, squeeze=False)
    labels = [f"{t}, d = {d}\nN = {pow2_label(n)}" for t, d, n in points]
    timed = [v for v in variants if any(r["value"] is not None for k, r in idx.items() if k[:2] == (v, backend))]
    spans = [x for k, r in idx.items() if k[1] == backend for x in (r["lo"], r["hi"], r["value"]) if x is not None]
    lo, hi = min(spans + [1.0]), max(spans + [1.0])
    handles = OrderedDict()
    for ax, pass_ in zip(axes[:, 0], passes):
        ax.axhline(1.0, color="0.3", linewidth=1.0)
        ax.set_ylim(lo - 0.06 * (hi - lo), hi + 0.06 * (hi - lo))
        for i, v in enumerate(timed):
            offset = (i - (len(timed) - 1) / 2) * 0.8 / len(timed)
            pts = [(k, idx.get((v, backend, pass_) + p)) for k, p in enumerate(points)]
            pts = [(k, r) for k, r in pts if r and r["value"] is not None]
            if not pts:
                continue
            ys = [r["value"] for _, r in pts]
            err = [[r["value"] - (r["lo"] if r["lo"] is not None else r["value"]) for _, r in pts],
                   [(r["hi"] if r["hi"] is not None else r["value"]) - r["value"] for _, r in pts]]
            h = ax.errorbar([k + offset for k, _ in pts], ys, yerr=err, fmt="o", markersize=5,
                            capsize=2, elinewidth=1.0, label=variant_name(v), color=f"C{variants.index(v)}")
            handles.setdefault(variant_name(v), h)
        missing = [variant_name(v) for v in variants if not any(idx.get((v, backend, pass_) + p) for p in points)]
        ax.set_title(PASS_NAMES[pass_] + (f" (not timed: {', '.join(missing)})" if missing else ""), fontsize=10)
        ax.set_ylabel(f"ours / {SDPA_NAMES[backend]}")
        style_groups(ax, labels)
    fig.suptitle(title, fontsize=11)
    fig.legend(list(handles.values()), list(handles), loc="upper center", ncol=len(handles), fontsize=9,
               bbox_to_anchor=(0.5, 0.965), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.945))
    fig.savefig(path)
    plt.close(fig)


def plot_stage10_packed(series, groups, passes, title, path):
    """The packed batch's rates, one panel per pass: at each (dtype, d) a bar per series (label,
    colour, hatch, {(pass, dtype, d): TFLOP/s})."""
    fig, axes = plt.subplots(len(passes), 1, figsize=(11.0, 2.3 * len(passes) + 0.6), dpi=110, sharex=True,
                             sharey=True, squeeze=False)
    width = 0.84 / len(series)
    for ax, pass_ in zip(axes[:, 0], passes):
        for i, (label, colour, hatch, rates) in enumerate(series):
            offset = (i - (len(series) - 1) / 2) * width
            pts = [(k, rates.get((pass_,) + g)) for k, g in enumerate(groups)]
            pts = [(k, y) for k, y in pts if y is not None]
            ax.bar([k + offset for k, _ in pts], [y for _, y in pts], width, label=label,
                   color="white" if hatch else colour, edgecolor=colour, hatch=hatch, linewidth=1.0)
        ax.set_title(PASS_NAMES[pass_], fontsize=10)
        ax.set_ylabel("TFLOP/s")
        style_groups(ax, [f"{t}, d = {d}" for t, d in groups])
    axes[0, 0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_stage10_window(idx, groups, sizes, passes, share, title, path):
    """A window's time over the plain causal time, one panel per N: at each (dtype, d) a bar per pass
    with the rounds' span; the share of the causal pairs the window keeps (dashed) and, at the
    target's N, the target (dotted)."""
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.8 * len(sizes) + 0.6, 4.0), dpi=110, sharey=True,
                             squeeze=False)
    width = 0.8 / len(passes)
    for ax, n in zip(axes[0], sizes):
        for i, pass_ in enumerate(passes):
            offset = (i - (len(passes) - 1) / 2) * width
            pts = [(k, idx.get((pass_, t, d, n))) for k, (t, d) in enumerate(groups)]
            pts = [(k, r) for k, r in pts if r and r["value"] is not None]
            err = [[r["value"] - r["lo"] for _, r in pts], [r["hi"] - r["value"] for _, r in pts]]
            ax.bar([k + offset for k, _ in pts], [r["value"] for _, r in pts], width, yerr=err, capsize=2,
                   color=PASS_COLOURS[pass_], label=PASS_NAMES[pass_], error_kw={"elinewidth": 1.0})
        ax.axhline(share[n], color="0.2", linestyle="--", linewidth=1.2, label="pairs kept / causal pairs")
        if n == STAGE10_WINDOW_TARGET_N:
            ax.axhline(STAGE10_WINDOW_TARGET, color="C3", linestyle=":", linewidth=1.5,
                       label=f"target ≤ {STAGE10_WINDOW_TARGET}")
        ax.set_title(f"N = {pow2_label(n)}: the window keeps {share[n]:.4f} of the causal pairs", fontsize=10)
        style_groups(ax, [f"{t}, d = {d}" for t, d in groups])
        ax.set_ylim(0, None)
    axes[0, 0].set_ylabel("time / causal time")
    handles = OrderedDict()
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    axes[0, -1].legend(list(handles.values()), list(handles), fontsize=8, loc="upper left",
                       bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def stage10_section(rows, images, out, plots_made):
    """Stage 10's switches (grouped heads, dropout, a window, packed batches) beside SDPA, from
    stage10.csv: a table of every ratio, plots of the ratios, of the packed batch's rates and of the
    window's time against the pairs it keeps, and the course's targets checked on the data."""
    w = out.append
    w("## Stage 10: what real models call {#results_stage10}")
    w("")
    w("Every run behind this section, round by round, and the tries that lost: \\ref stage10_record.")
    w("")
    if rows is None:
        w("\\note Stage 10 has not been measured yet: `docs/results/stage10.csv` is not there "
          "(`bench/gpu_session.sh stage10` writes it).")
        w("")
        return
    rows = [r for r in rows if r["kind"] in ("vs_sdpa", "vs_causal", "vs_dense", "memory")]
    if not rows:
        w("\\note `docs/results/stage10.csv` holds no usable rows yet.")
        w("")
        return
    dense = [r for r in rows if r["kind"] == "vs_sdpa" and r["variant"] != "varlen"]
    w(f"Stage 10's switches of stage 07's forward and stage 09's backward, each timed beside PyTorch's SDPA on the "
      f"same problem: grouped-query heads, the plain causal kernels, dropout, a sliding window and a packed batch of "
      f"mixed lengths{lesson_ref('stage10_measured')}. Measured on **{md(span(r['gpu'] for r in rows))}**, "
      f"{span(r['date'] for r in rows)}, by `bench/sdpa_compare.py --stages 10` (`bench/gpu_session.sh stage10`); "
      "`docs/results/stage10.txt` holds the same data as a text table.")
    if dense:
        w(f"The dense problems are causal, with B·N = {span(r['B'] * r['N'] for r in dense)} tokens and H·d = "
          f"{span(r['H'] * r['d'] for r in dense)} (H counts the query heads), dtypes {span(r['dtype'] for r in dense)}.")
    w("Rates count the visible (query, key) pairs only. Each ratio is taken between the two timings of one round; "
      f"the tables show its median over the rounds ({span(r['rounds'] for r in rows if r['rounds'])} rounds) with "
      "the smallest and largest in brackets" + (", and the plots draw the same span as a bar." if HAVE_MPL else "."))
    w("")
    stage10_sdpa(dense, images, out, plots_made)
    stage10_window([r for r in rows if r["kind"] == "vs_causal"], images, out, plots_made)
    stage10_packed([r for r in rows if r["variant"].startswith("varlen") or r["kind"] == "memory"], images, out,
                   plots_made)
    stage10_targets(rows, out)


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


def stage10_sdpa(rows, images, out, plots_made):
    """Ours / SDPA flash and cuDNN by rate for each dense variant, pass and (dtype, d, N)."""
    w = out.append
    if not section_opening(w, "### Grouped heads, causal and dropout against SDPA {#results_stage10_sdpa}", rows,
                           "`stage10.csv` has no dense variant beside SDPA."):
        return
    idx = {(r["variant"], sdpa_backend(r["other"])[0], r["pass"], r["dtype"], r["d"], r["N"]): r for r in rows}
    variants = sorted({r["variant"] for r in rows}, key=variant_key)
    points = sorted({(r["dtype"], r["d"], r["N"]) for r in rows}, key=point_key)
    heads = {(r["dtype"], r["d"], r["N"]): (r["B"], r["H"]) for r in rows}
    passes = passes_of(rows)
    backends = [b for b in ("sdpa_flash", "sdpa_cudnn")
                if any(k[1] == b and r["value"] is not None for k, r in idx.items())]
    w("SDPA runs grouped heads with `enable_gqa=True` (and the plain causal case too), dropout with the same "
      "`dropout_p`. Above 1.0 ours is faster."
      + (f" The plot{'s' if len(backends) > 1 else ''} give{'' if len(backends) > 1 else 's'} ours / "
         + " and then ours / ".join(SDPA_NAMES[b] for b in backends) + " by rate, a panel per pass and a dot per "
         "variant at each (dtype, d, N) point: the median over the rounds, its bar from the smallest to the largest."
         if HAVE_MPL and backends else ""))
    w("")
    if HAVE_MPL:
        for b in backends:
            name = f"results_stage10_vs_{b[len('sdpa_'):]}.png"
            plot_stage10_ratios(idx, variants, points, passes, b, f"stage 10 / {SDPA_NAMES[b]} by rate, median over "
                                "the rounds (bar: smallest to largest)", os.path.join(images, name))
            plots_made.append(name)
            w(f'\\image html {name} "Ours / {SDPA_NAMES[b]} by rate, per pass, variant and (dtype, d, N)"')
            w("")
    for pass_ in passes:
        w(f"{PASS_NAMES[pass_].capitalize()}: ours / SDPA flash, with ours / SDPA cuDNN in parentheses.")
        w("")
        w("| dtype | d | N | B | H | " + " | ".join(variant_name(v) for v in variants) + " |")
        w("|---|---:|---:|---:|---:|" + "---:|" * len(variants))
        for p in points:
            cells = []
            for v in variants:
                fl, cu = (idx.get((v, b, pass_) + p) for b in ("sdpa_flash", "sdpa_cudnn"))
                text = ratio_cell(fl, 1.0)
                cells.append(text + (f"<br>({ratio_cell(cu)})" if cu and cu["value"] is not None else ""))
            w(f"| {p[0]} | {p[1]} | {p[2]} | {heads[p][0]} | {heads[p][1]} | " + " | ".join(cells) + " |")
        w("")
    w("Bold: slower than SDPA flash. " + refused_text(rows))
    w("")
    # What the plots show, from the data: how often ours is ahead of each backend, per pass, and where
    # it is behind flash.
    for b in backends:
        parts = []
        for pass_ in passes:
            values = [r["value"] for k, r in idx.items() if k[1:3] == (b, pass_) and r["value"] is not None]
            parts.append(f"{PASS_NAMES[pass_]} at {count_text(values, lambda x: x >= 1.0)}")
        w(f"Ours is at least as fast as {SDPA_NAMES[b]}: " + "; ".join(parts) + ".")
        if b == "sdpa_flash":
            behind = []
            for pass_ in passes:
                for v in variants:
                    values = [idx[(v, b, pass_) + p]["value"] for p in points
                              if idx.get((v, b, pass_) + p) and idx[(v, b, pass_) + p]["value"] is not None]
                    slow = [x for x in values if x < 1.0]
                    if slow:
                        behind.append(f"{variant_name(v)} {PASS_NAMES[pass_]} at {len(slow)} of {len(values)} "
                                      f"(down to {fmt_num(min(slow))}×)")
            if behind:
                w("Behind flash (a median below 1.0): " + "; ".join(behind) + ".")
        w("")


def stage10_window(rows, images, out, plots_made):
    """A window's time over the plain causal kernels' at the same N, beside the share of the causal
    pairs it keeps, computed from N and the window."""
    w = out.append
    if not section_opening(w, "### A sliding window against causal {#results_stage10_window}", rows,
                           "`stage10.csv` has no window timed against the plain causal kernels."):
        return
    for variant in sorted({r["variant"] for r in rows}):
        vrows = [r for r in rows if r["variant"] == variant]
        m = re.fullmatch(r"window(\d+)", variant)
        left = int(m.group(1)) if m else None
        idx = {(r["pass"], r["dtype"], r["d"], r["N"]): r for r in vrows}
        passes = passes_of(vrows)
        sizes = sorted({r["N"] for r in vrows})
        groups = sorted({(r["dtype"], r["d"]) for r in vrows}, key=point_key)
        share = {n: window_share(n, left) for n in sizes} if left is not None else {}
        seen = f": query i sees keys i − {left} to i, at most {left + 1} keys" if left is not None else ""
        w(f"The {md(variant_name(variant))}{seen}{lesson_ref('stage10_window')}. Cells: the window's time and its time over the plain causal "
          "kernels' at the same N (SDPA's flash has no window: ours alone). The last column is the share of the "
          "causal (query, key) pairs the window keeps, counted from N and the window: at the causal kernels' rate "
          "the time cannot fall below it."
          + (" The plot gives the same ratios, a panel per N and a bar per pass with the rounds' span; the dashed line "
             "is the share of the pairs kept" + (", the dotted one the target." if STAGE10_WINDOW_TARGET_N in sizes
                                                   else ".") if HAVE_MPL and share else ""))
        w("")
        if HAVE_MPL and share:
            name = f"results_stage10_{slug(variant)}.png"
            plot_stage10_window(idx, groups, sizes, passes, share, f"{variant_name(variant)}: time over the plain "
                                "causal time, median over the rounds (bar: smallest to largest)",
                                os.path.join(images, name))
            plots_made.append(name)
            w(f'\\image html {name} "Time of the {variant_name(variant)} over the plain causal time, '
              'beside the share of the causal pairs it keeps"')
            w("")
        w("| dtype | d | N | B | H | " + " | ".join(PASS_NAMES[p] for p in passes) + " | pairs kept / causal |")
        w("|---|---:|---:|---:|---:|" + "---:|" * (len(passes) + 1))
        for t, d, n, b, h in sorted({(r["dtype"], r["d"], r["N"], r["B"], r["H"]) for r in vrows}, key=point_key):
            cells = []
            for pass_ in passes:
                r = idx.get((pass_, t, d, n))
                cells.append(f"{fmt_num(r['ours_ms'])} ms, {ratio_cell(r)}" if r and r["ours_ms"] else ratio_cell(r))
            kept = f"{share[n]:.4f}" if n in share else "–"
            w(f"| {t} | {d} | {n} | {b} | {h} | " + " | ".join(cells) + f" | {kept} |")
        w("")
        for n in sizes:
            values = [r["value"] for r in vrows if r["N"] == n and r["value"] is not None]
            if values and n in share and share[n] >= 1.0:
                w(f"At N = {n} the window keeps every causal pair: its time is {fmt_num(min(values))} to "
                  f"{fmt_num(max(values))} of the causal time.")
            elif values and n in share:
                w(f"At N = {n} the window keeps {share[n]:.4f} of the causal pairs and takes {fmt_num(min(values))} "
                  f"to {fmt_num(max(values))} of the causal time: {fmt_num(min(values) / share[n])} to "
                  f"{fmt_num(max(values) / share[n])} times the share of the work.")
        w("")


def stage10_packed(rows, images, out, plots_made):
    """The packed batch of mixed lengths: its rate beside the dense kernel's on a uniform batch of
    the same tokens and beside SDPA's nested and padded batches; the padded batch's memory."""
    w = out.append
    timed = [r for r in rows if r["kind"] in ("vs_dense", "vs_sdpa")]
    if not section_opening(w, "### The packed batch against dense, nested and padded {#results_stage10_varlen}", timed,
                           "`stage10.csv` has no packed batch."):
        return
    # Columns: the packed kernel over the dense one (mixed lengths, then uniform ones), then each SDPA
    # backend and layout that ran at least once.
    cols = [("vs_dense", "varlen", "stage10_dense_uniform", "ours packed / dense", STAGE10_PACKED_OVER_DENSE),
            ("vs_dense", "varlen_uniform", "stage10_dense_uniform", "ours packed, uniform lengths / dense", None)]
    sdpa = sorted({r["other"] for r in timed if r["kind"] == "vs_sdpa" and r["value"] is not None},
                  key=lambda o: (impl_key(sdpa_backend(o)[0]), list(STAGE10_LAYOUTS).index(sdpa_backend(o)[1])
                                 if sdpa_backend(o)[1] in STAGE10_LAYOUTS else len(STAGE10_LAYOUTS)))
    for o in sdpa:
        b, layout = sdpa_backend(o)
        cols.append(("vs_sdpa", "varlen", o, f"{SDPA_NAMES.get(b, b)} {STAGE10_LAYOUTS.get(layout, layout)}", 1.0))
    idx = {(r["kind"], r["variant"], r["other"], r["pass"], r["dtype"], r["d"], r["N"]): r for r in timed}
    cols = [c for c in cols if any(k[:3] == c[:3] for k in idx)]
    passes = passes_of(timed)
    shapes = sorted({(r["dtype"], r["d"], r["N"], r["B"], r["H"]) for r in timed}, key=point_key)
    w(f"One batch of {span(r['B'] for r in timed)} sequences of mixed lengths, {span(r['N'] for r in timed)} tokens "
      f"in all, packed end to end{lesson_ref('stage10_cu_seqlens')}; the dense kernel runs a uniform batch of the same tokens, "
      "SDPA a nested (jagged) batch and a batch padded to the longest sequence with a mask. The rates count the "
      "visible pairs of each batch."
      + (" The plot gives each batch's rate, a panel per pass: ours packed (solid) beside the dense kernel on the "
         "uniform batch (hatched), then SDPA's nested batches (solid) and padded ones (hatched), a colour per backend."
         if HAVE_MPL else ""))
    w("")
    if HAVE_MPL:
        ours = {}
        dense_rates = {}
        for r in timed:
            if r["kind"] == "vs_dense" and r["variant"] == "varlen":
                ours[(r["pass"], r["dtype"], r["d"])] = r["ours_tflops"]
                dense_rates[(r["pass"], r["dtype"], r["d"])] = r["other_tflops"]
        series = [("ours, packed", STAGE10_COLOURS["stage10"], "", ours),
                  ("ours, dense on a uniform batch", STAGE10_COLOURS["stage10"], "//", dense_rates)]
        for o in sdpa:
            b, layout = sdpa_backend(o)
            rates = {(r["pass"], r["dtype"], r["d"]): r["other_tflops"] for r in timed
                     if r["other"] == o and r["other_tflops"] is not None}
            series.append((f"{SDPA_NAMES.get(b, b)}, {STAGE10_LAYOUTS.get(layout, layout)}",
                           STAGE10_COLOURS.get(b, "C7"), "//" if layout == "padded" else "", rates))
        groups = sorted({(r["dtype"], r["d"]) for r in timed}, key=point_key)
        name = "results_stage10_packed.png"
        plot_stage10_packed(series, groups, passes, "the packed batch: TFLOP/s of the visible pairs",
                            os.path.join(images, name))
        plots_made.append(name)
        w(f'\\image html {name} "TFLOP/s of the packed batch beside the dense kernel and SDPA\'s nested and padded '
          'batches, per pass"')
        w("")
    # Two tables: the packed kernel against the dense one, then against SDPA.
    for part, caption, head in (
            ("vs_dense", "Ours: the packed batch's rate over the dense kernel's on the uniform batch.",
             "| dtype | d | H | pass | ours packed TFLOP/s | "),
            ("vs_sdpa", "Ours / SDPA by rate, the packed batch against SDPA's nested and padded ones.",
             "| dtype | d | pass | ")):
        pcols = [c for c in cols if c[0] == part]
        if not pcols:
            continue
        w(caption)
        w("")
        w(head + " | ".join(c[3] for c in pcols) + " |")
        w("|---|---:|" + ("---:|---|---:|" if part == "vs_dense" else "---|") + "---:|" * len(pcols))
        for t, d, n, b, h in shapes:
            for pass_ in passes:
                rs = [idx.get((c[0], c[1], c[2], pass_, t, d, n)) for c in pcols]
                cells = " | ".join(ratio_cell(r, c[4]) for r, c in zip(rs, pcols))
                if part == "vs_dense":
                    rate = next((r["ours_tflops"] for r in rs if r and r["variant"] == "varlen"), None)
                    w(f"| {t} | {d} | {h} | {pass_} | {fmt_num(rate)} | {cells} |")
                else:
                    w(f"| {t} | {d} | {pass_} | {cells} |")
        w("")
    w(f"Bold: below the target ({STAGE10_PACKED_OVER_DENSE}× the dense rate) or slower than SDPA. "
      + refused_text([r for r in timed if r["kind"] == "vs_sdpa"]))
    w("")
    for c in cols:
        values = [r["value"] for k, r in idx.items() if k[:3] == c[:3] and r["value"] is not None]
        if values and c[0] == "vs_sdpa":
            w(f"- {c[3]}: ours is {fmt_num(min(values))} to {fmt_num(max(values))} times as fast.")
        elif values:
            w(f"- {c[3]}: {fmt_num(min(values))}× to {fmt_num(max(values))}×.")
    w("")
    memory = OrderedDict()
    for r in sorted((r for r in rows if r["kind"] == "memory" and r["value"] is not None),
                    key=lambda r: point_key((r["dtype"], r["d"], r["N"]))):
        m = re.search(r"(\d+) bytes padded, (\d+) packed", r["note"])
        memory.setdefault((r["dtype"], r["d"], r["N"], r["B"]), (r["value"], m))
    if memory:
        w("Memory: SDPA's padded batch (q, k, v, o and the mask) over the packed one (q, k, v, o):")
        w("")
        w("| dtype | d | tokens | sequences | padded | packed | padded / packed |")
        w("|---|---:|---:|---:|---:|---:|---:|")
        for (t, d, n, b), (value, m) in memory.items():
            padded, packed = (fmt_bytes(int(m.group(1))), fmt_bytes(int(m.group(2)))) if m else ("–", "–")
            w(f"| {t} | {d} | {n} | {b} | {padded} | {packed} | {fmt_num(value)}× |")
        w("")


def stage10_targets(rows, out):
    """The course's targets for stage 10, checked on the median ratios of stage10.csv."""
    w = out.append
    w("### Targets {#results_stage10_targets}")
    w("")
    lines = []

    def check(label, goal, pred, ok, worst_is_max=False, key=lambda r: (r["dtype"], r["N"], r["d"], r["pass"])):
        ratios = [(key(r), r["value"]) for r in rows if r["value"] is not None and pred(r)]
        if ratios:
            lines.append(target_row(label, goal, ratios, ok, worst_is_max, what="points"))

    packed = STAGE10_PACKED_OVER_DENSE
    check("packed batch / dense kernel on a uniform batch, every pass", f"≥ {packed}×",
          lambda r: (r["kind"], r["variant"]) == ("vs_dense", "varlen"), lambda x: x >= packed)
    for o in sorted({r["other"] for r in rows if r["kind"] == "vs_sdpa" and sdpa_backend(r["other"])[1] == "varlen"},
                    key=lambda o: impl_key(sdpa_backend(o)[0])):
        check(f"packed batch / {SDPA_NAMES.get(sdpa_backend(o)[0], o)} nested, every pass", "≥ 1.0×",
              lambda r, o=o: (r["kind"], r["other"]) == ("vs_sdpa", o), lambda x: x >= 1.0)
    gqa = sorted({r["variant"] for r in rows if r["variant"].startswith("gqa")}, key=variant_key)
    for pass_ in ("forward", "fwd+bwd"):
        check(f"grouped heads ({', '.join(variant_name(v) for v in gqa)}) / SDPA flash with `enable_gqa=True`, "
              f"{PASS_NAMES[pass_]}", "≥ 1.0×",
              lambda r, p=pass_: r["kind"] == "vs_sdpa" and r["variant"] in gqa and r["pass"] == p
              and sdpa_backend(r["other"])[0] == "sdpa_flash", lambda x: x >= 1.0,
              key=lambda r: (r["dtype"], r["N"], r["d"], r["variant"]))
    for v in sorted({r["variant"] for r in rows if r["variant"].startswith("dropout")}):
        check(f"{variant_name(v)} / SDPA flash with the same `dropout_p`, forward + backward", "≥ 1.0×",
              lambda r, v=v: (r["kind"], r["variant"], r["pass"]) == ("vs_sdpa", v, "fwd+bwd")
              and sdpa_backend(r["other"])[0] == "sdpa_flash", lambda x: x >= 1.0)
    n = STAGE10_WINDOW_TARGET_N
    windows = sorted({r["variant"] for r in rows if r["kind"] == "vs_causal" and r["N"] == n})
    for v in windows:
        check(f"{variant_name(v)} time / plain causal time, N = {n}, every pass", f"≤ {STAGE10_WINDOW_TARGET}×",
              lambda r, v=v: (r["kind"], r["variant"], r["N"]) == ("vs_causal", v, n),
              lambda x: x <= STAGE10_WINDOW_TARGET, worst_is_max=True)
    if not lines:
        w("`stage10.csv` has none of the ratios the course's targets for stage 10 compare.")
        w("")
        return
    targets_table(lines, out)
    for v in windows:
        m = re.fullmatch(r"window(\d+)", v)
        if m:
            share = window_share(n, int(m.group(1)))
            w(f"The {variant_name(v)} keeps {share:.4f} of the causal (query, key) pairs at N = {n} (kept pairs "
              "over causal pairs, counted from N and the window). That share is the floor of its time over the "
              f"causal time at the causal kernels' rate; the goal of {STAGE10_WINDOW_TARGET}× lies "
              + ("below it: no kernel that computes every pair the window keeps can meet it at this N."
                 if share > STAGE10_WINDOW_TARGET else "above it."))
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
    targets_table(lines, out)


# ----------------------------------------------------------------------------- page
def newcomer_section(results_dir, out):
    """A reader's first run on the GPU machine (bench/gpu_session.sh newcomer, newcomer_test): the
    records as they were written, machine, compilers, date, every verdict."""
    files = [os.path.join(results_dir, f) for f in ("newcomer.txt", "newcomer_test.txt")]
    if not os.path.exists(files[0]):
        return False
    out.append("## A reader's first run on the GPU machine {#results_newcomer}")
    out.append("")
    out.append("A fresh copy of the course on the GPU machine, then the README's two commands unchanged "
               "(`bench/gpu_session.sh newcomer newcomer_test`). The machine reaches no package "
               "registry, so Eigen, CLI11 and doctest come from Debian's `.deb` files and the docs, "
               "which need Doxygen, are left out there.")
    out.append("")
    for path in files:
        if os.path.exists(path):
            out.append("~~~")
            with open(path, encoding="utf-8") as f:
                out.extend(line.rstrip("\n") for line in f)
            out.append("~~~")
            out.append("")
    return True


def read_ncu_sections(path):
    """An Nsight Compute text report of docs/results/, cut at its "== name ==" headers: for each
    part, every metric it prints (raw names and the sections' friendly names) with its value as
    a float, the first occurrence of a name kept."""
    parts, name = OrderedDict(), ""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                head = re.match(r"^=+ (.+?) =+\s*$", line)
                if head:
                    name = head.group(1).strip()
                    parts.setdefault(name, {})
                    continue
                m = re.match(r"^ {4}(\S.*?\S)\s{2,}(?:(\S+)\s+)?([\d,]+(?:\.\d+)?)\s*$", line)
                if m and not m.group(1).startswith(("Metric Name", "----")):
                    parts.setdefault(name, {}).setdefault(m.group(1), (float(m.group(3).replace(",", "")), m.group(2) or ""))
    except OSError:
        return {}
    return parts


def read_ncu_report(results_dir, *names):
    """Every counter of the Nsight Compute reports `names` of results_dir (their parts merged, as
    read_ncu_sections() reads them; the first file and the first part that prints a name win)."""
    metrics = {}
    for name in names:
        for part in read_ncu_sections(os.path.join(results_dir, name)).values():
            for k, v in part.items():
                metrics.setdefault(k, v)
    return metrics


def count_words(n):
    """2117640202 -> "2.12 billion", 303059534 -> "303 million", 21070 -> "21 thousand"."""
    for scale, word in ((1e9, "billion"), (1e6, "million"), (1e3, "thousand")):
        if n >= scale:
            return f"{n / scale:.3g} {word}"
    return f"{n:.0f}"


# ----------------------------------------------------------------------------- stage 09's road
# bench/sdpa_compare.py's tables of stage 09 (what bench/gpu_session.sh quick or sweep09 prints with
# STEPS09): the default main kernel (rows stage09) beside SDPA, then one table per other step
# (--steps09: rows stage09_step<i>) and dtype. Values of "-" read as None.
STAGE09_DEFAULT_HEAD = re.compile(r"^(?P<gpu>.+?), (?P<date>\d{4}-\d\d-\d\d): stage 07 forward \+ stage 09 backward "
                                  r"in (?P<dtype>\w+)")
STAGE09_STEP_HEAD = re.compile(r"^stage09_step(?P<step>\d+) in (?P<dtype>\w+) beside the default main kernel")
# d N causal | 09 f+b, flash, cudnn, /flash, /cudnn | 09 bwd, /flash, /cudnn | bwd ms, det ms, det/at
STAGE09_DEFAULT_COLUMNS = ["fb", "fb_flash_tflops", "fb_cudnn_tflops", "fb_vs_flash", "fb_vs_cudnn",
                           "bwd", "bwd_vs_flash", "bwd_vs_cudnn", "bwd_ms", "det_ms", "det_vs_atomic"]
# d N causal | f+b, /09, /flash | bwd, /09, /flash | bwd ms, det ms, det/at
STAGE09_STEP_COLUMNS = ["fb", "fb_vs_default", "fb_vs_flash", "bwd", "bwd_vs_default", "bwd_vs_flash",
                        "bwd_ms", "det_ms", "det_vs_atomic"]


def read_stage09_steps(path):
    """The record of stage 09's road (docs/results/stage09_steps_quick.txt): one dict per (step,
    dtype, d, N, causal) with the columns above, the GPU, the date, the record's note on the size of
    the problems, and the step the default main kernel was in that run (its note "the default main
    kernel (rows stage09) was still step 0"; None when the record does not say: its rows are then
    step None, "default"). Any number of steps: every stage09_step<i> table is read. None when the
    file is not there or holds no row."""
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    text = "\n".join(lines)
    m = re.search(r"default main kernel \(rows stage09\) was (?:still )?step (\d+)", text)
    default_step = int(m.group(1)) if m else None
    m = re.search(r"B\s*\*\s*N\s*=\s*\d+,\s*H\s*\*\s*d\s*=\s*\d+", text)
    size_note = m.group(0) if m else ""
    rows, gpu, date, table = {}, "", "", None
    for line in lines:
        head = STAGE09_DEFAULT_HEAD.match(line)
        if head:
            gpu, date = head.group("gpu").strip(), head.group("date")
            table = ("default", default_step, head.group("dtype"), STAGE09_DEFAULT_COLUMNS)
            continue
        head = STAGE09_STEP_HEAD.match(line)
        if head:
            table = ("step", int(head.group("step")), head.group("dtype"), STAGE09_STEP_COLUMNS)
            continue
        if table is None:
            continue
        fields = line.split()
        if fields and fields[0] == "d":  # the column heads
            continue
        bad = bool(fields) and fields[-1] == "BAD"
        if bad:
            fields = fields[:-1]
        if not fields or not fields[0].isdigit() or len(fields) != 3 + len(table[3]):
            table = None  # a blank line or anything else ends the table
            continue
        kind, step, dtype, columns = table
        number = lambda x: None if x in ("-", "–") else float(x)
        try:
            r = {k: number(v) for k, v in zip(columns, fields[3:])}
            r.update(kind=kind, step=step, dtype=dtype, d=int(fields[0]), N=int(fields[1]), causal=truthy(fields[2]),
                     bad=bad)
        except ValueError:
            continue
        key = (step, dtype, r["d"], r["N"], r["causal"])
        if kind == "step" or key not in rows:  # a step's own table wins over the default rows of that step
            rows[key] = r
    if not rows:
        return None
    return {"gpu": gpu, "date": date, "default_step": default_step, "size_note": size_note, "rows": list(rows.values())}


def stage09_step_order(road09):
    """The steps of the record in order: the default rows first when their step is unknown (None)."""
    return sorted({r["step"] for r in road09["rows"]}, key=lambda s: (-1 if s is None else s))


# The step each main kernel of stage 09's road changes (attention.cu's road(): "step 4 with ..."):
# the whole road's table gives each step's gain over that one.
STAGE09_ROAD_BASE = {1: 0, 2: 1, 3: 2, 4: 2, 5: 4, 6: 4, 7: 4, 8: 4, 9: 4, 10: 8}


def stage09_road_table(road09, path, dtype="bf16", name="docs/results/stage09_steps_quick.txt", over_default=False,
                       base=None, how="bench/gpu_session.sh quick with STEPS09"):
    """stage09_road_table.txt, which stage 09's lesson shows: the backward alone of every main kernel
    of the record, TFLOP/s with its ratio to SDPA flash's backward and its gain over the step before,
    one block of rows per head dimension; then every point where a step was slower than the one
    before it. Nothing in it is typed: any number of steps, sizes and head dimensions. `name`: the
    record it comes from, as the caption cites it. `over_default`: each step's gain over the run's
    default main kernel instead (for steps that branch off it rather than follow one another). `base`:
    each step's gain over the step it changes instead (STAGE09_ROAD_BASE), marked "/s<base>". `how`:
    the command that writes the record, named while it is missing."""
    if not road09 or not any(r["dtype"] == dtype for r in road09["rows"]):
        lines = [f"stage 09's road: not measured yet (needs {name}: {how})"]
    else:
        rows = [r for r in road09["rows"] if r["dtype"] == dtype]
        cell = {(r["step"], r["d"], r["N"], r["causal"]): r for r in rows}
        steps = [s for s in stage09_step_order(road09) if any(r["step"] == s for r in rows)]
        cols = sorted({(r["N"], r["causal"]) for r in rows})
        against = ("the default main kernel" if over_default else
                   "the step it changes (/s<step>)" if base else "the step before")
        lines = [f"stage 09's road, the backward alone, {dtype}: TFLOP/s (its ratio to SDPA flash's backward) "
                 f"x its gain over {against}",
                 f"{road09['gpu']}, {road09['date']}" + (f"; {road09['size_note']}" if road09["size_note"] else "")
                 + f"; from {name}"]
        width = 24 if base else 20
        head = f"{'':<12}" + "".join(f"{f'N={n}' + (' causal' if c else ''):<{width}}" for n, c in cols)
        slower = {}  # (d, step, the step it was compared with): [(gain, column)] where it was slower
        for d in sorted({r["d"] for r in rows}):
            lines.append("")
            lines.append((f"d={d}".ljust(12) + head[12:]).rstrip())
            before = road09["default_step"] if over_default else None
            for step in steps:
                cells = []
                for n, c in cols:
                    r = cell.get((step, d, n, c))
                    if not r or r["bwd"] is None:
                        cells.append(f"{'-':<{width}}")
                        continue
                    text = f"{r['bwd']:.1f}" + (f" ({r['bwd_vs_flash']:.2f})" if r["bwd_vs_flash"] is not None else "")
                    if base is not None:
                        before = base.get(step)
                    prev = cell.get((before, d, n, c)) if before is not None and before != step else None
                    if prev and prev["bwd"]:
                        gain = r["bwd"] / prev["bwd"]
                        text += f" x{gain:.2f}" + (f"/s{before}" if base is not None else "")
                        if round(gain, 2) < 1.0:
                            slower.setdefault((d, step, before), []).append((gain, f"N={n}" + (" causal" if c else "")))
                    cells.append(f"{text + (' BAD' if r['bad'] else ''):<{width}}")
                label = "  default" if step is None else f"  step {step}"
                lines.append(f"{label:<12}" + "".join(cells).rstrip())
                if step is not None and not over_default:
                    before = step
        lines.append("")
        for (d, step, before), points in slower.items():  # one line per step and head dimension
            gains = sorted(g for g, _ in points)
            span = f"x{gains[0]:.2f}" + (f" to x{gains[-1]:.2f}" if f"{gains[-1]:.2f}" != f"{gains[0]:.2f}" else "")
            where = "every column" if len(points) == len(cols) else ", ".join(col for _, col in points)
            lines.append(f"  slower: step {step} {span}" + (f" of step {before}" if base is not None else "")
                         + f" at d={d}: {where}")
        default = road09["default_step"]
        lines.append("  steps by number only: the record does not name them (stage09_backward_kernel --help does)")
        if default is None:
            lines.append("  default: the main kernel that ran by default (rows stage09); the record does not say its step")
        else:
            lines.append(f"  step {default}: the default main kernel of that run (rows stage09); the other steps ran beside it "
                         "(--steps09, rows stage09_step<i>)")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return lines


# FLOPs per byte read from shared memory of stage 09's main kernels, as its lesson counts them from
# their ldmatrix.x4 (512 bytes) and mma (4096 FLOPs) per pair of blocks: the first kernel (step 0,
# "where the time goes", question 3) and the warp-tiled one of step 1 at d = 64. An SM's shared
# memory delivers 128 bytes per clock.
# The records of stage 09's default main kernel (step 9) on the grid: the sizes other than 4096 in
# one run, 4096 and 16384 in the road's run of the same day and GPU.
STAGE09_DEFAULT_GRID_RECORDS = ("stage09_grid_step9_quick.txt", "stage09_road09.txt")


def read_stage09_default_grid(results_dir):
    """The default main kernel's points of STAGE09_DEFAULT_GRID_RECORDS: {(dtype, d, N, causal):
    [09 f+b, flash, cudnn, /flash, /cudnn, 09 bwd, /flash, /cudnn, bwd ms, det ms, det/at]} from their
    pair tables (sdpa_compare.py's table of stage 07 + stage 09, each point once, the first record
    first), with the records' GPUs and dates."""
    points, gpus, dates = OrderedDict(), [], []
    for name in STAGE09_DEFAULT_GRID_RECORDS:
        try:
            with open(os.path.join(results_dir, name), encoding="utf-8") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        dtype = None
        for line in lines:
            head = re.match(r"^(.+?), (\d{4}-\d{2}-\d{2}): stage 07 forward \+ stage 09 backward in (bf16|fp16)", line)
            if head:
                dtype = head.group(3)
                gpus.append(head.group(1).strip())
                dates.append(head.group(2))
                continue
            if not line.strip():
                dtype = None
                continue
            cells = line.split()
            if dtype and len(cells) == 14 and cells[0].isdigit():
                key = (dtype, int(cells[0]), int(cells[1]), cells[2] == "True")
                points.setdefault(key, [float(c) for c in cells[3:]])
    return points, sorted(set(gpus)), sorted(set(dates))


def stage09_default_grid_numbers(results_dir):
    """The figures of the stage 09 lesson's sweep section (read_stage09_default_grid()): forward +
    backward over SDPA flash's pair, \\s09_sweep_fb_flash, and over cuDNN's, \\s09_sweep_fb_cudnn; the
    backward alone over flash's, \\s09_sweep_bwd_flash; the deterministic backward's time over the
    atomic one, \\s09_sweep_det; the sizes they cover, \\s09_sweep_sizes, and the records' GPU and
    dates, \\s09_sweep_gpu and \\s09_sweep_date ("–" without data)."""
    points, gpus, dates = read_stage09_default_grid(results_dir)
    aliases = OrderedDict()
    aliases["s09_sweep_fb_flash"] = span_ratios(v[3] for v in points.values())
    aliases["s09_sweep_fb_cudnn"] = span_ratios(v[4] for v in points.values())
    aliases["s09_sweep_bwd_flash"] = span_ratios(v[6] for v in points.values())
    aliases["s09_sweep_det"] = span_ratios(v[10] for v in points.values())
    sizes = sorted({k[2] for k in points})
    aliases["s09_sweep_sizes"] = ", ".join(str(n) for n in sizes) if sizes else "–"
    aliases["s09_sweep_gpu"] = ", ".join(gpus) or "–"
    aliases["s09_sweep_date"] = ", ".join(dates) or "–"
    return aliases


def stage09_default_grid_table(results_dir, path):
    """The lesson's table of the default main kernel on the grid (read_stage09_default_grid()): one
    line per point, the ratios the course's targets name."""
    points, gpus, dates = read_stage09_default_grid(results_dir)
    with open(path, "w", encoding="utf-8") as f:
        if not points:
            f.write("(no record of the default main kernel on the grid is committed)\n")
            return
        f.write(f"{', '.join(gpus)}, {', '.join(dates)}: stage 07 forward + stage 09 backward (default main\n"
                "kernel) beside SDPA. f+b: forward + backward timed as one pair; bwd: the backward alone;\n"
                "det/at: the deterministic backward's time over the atomic one\n\n")
        f.write(f"{'dtype':>5} {'d':>4} {'N':>6} {'causal':>7}  {'f+b TFLOP/s':>11} {'/flash':>7} {'/cudnn':>7}  "
                f"{'bwd TFLOP/s':>11} {'/flash':>7} {'/cudnn':>7}  {'det/at':>6}\n")
        for (dtype, d, n, causal), v in sorted(points.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], kv[0][3])):
            f.write(f"{dtype:>5} {d:>4} {n:>6} {str(causal):>7}  {v[0]:>11.1f} {v[3]:>7.2f} {v[4]:>7.2f}  "
                    f"{v[5]:>11.1f} {v[6]:>7.2f} {v[7]:>7.2f}  {v[10]:>6.2f}\n")
        f.write(f"\nfrom docs/results/{' and '.join(STAGE09_DEFAULT_GRID_RECORDS)}\n"
                "(each point the round of median time, as each run printed it)\n")


STAGE09_FLOPS_PER_SMEM_BYTE = {"step0": 12.8, "step1": 16.0}
SMEM_BYTES_PER_CLOCK = 128


def span_ratios(values):
    """'lo to hi' of the values that are not None, to two places ('lo' when both round alike; '–'
    when there is none)."""
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    lo, hi = f"{min(values):.2f}", f"{max(values):.2f}"
    return lo if lo == hi else f"{lo} to {hi}"


def stage09_numbers(ceilings, road09, results_dir):
    """The numbers stage 09's lesson quotes: its shared-memory bound set against the mma.sync ceiling
    (ceilings: the lines of mma_ceiling.jsonl by name), its road's ratios (road09:
    read_stage09_steps()), each a span over both dtypes, both sizes, causal and not, and Nsight
    Compute's counters of step 0 beside step 1 at d = 64 (ncu_stage09_d64_metrics.txt,
    ncu_stage09_tiled_d64_metrics.txt)."""
    aliases = OrderedDict()
    for step, name in (("step0", "ncu_stage09_d64_metrics.txt"), ("step1", "ncu_stage09_tiled_d64_metrics.txt")):
        metrics = read_ncu_report(results_dir, name)
        for key, metric, fmt in (
                ("tensor", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "{:.1f}%"),
                ("barrier", "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio", "{:.2f}"),
                ("mio", "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio", "{:.2f}")):
            aliases[f"s09_ncu_{step}_d64_{key}"] = fmt.format(metrics[metric][0]) if metric in metrics else "–"
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

    span2 = span_ratios

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
            aliases[f"s09_road_s{a}_over_s{b}_d{d}"] = span2(over(a, b, d))
    for d in (64, 128):
        aliases[f"s09_road_s2_fb_flash_d{d}"] = span2(r["fb_vs_flash"] for r in points(2, d))
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
    aliases["s09_road_s2_fb_cudnn"] = span2(cudnn)
    for step in (0, 2):
        aliases[f"s09_road_s{step}_det"] = span2(r["det_vs_atomic"] for r in points(step))
    return aliases


def stage09_grid_numbers(results_dir, name, prefix):
    """Stage 09's default main kernel on the grid's other sizes (N 512, 1024, 2048 and 8192), from a
    ratios-over-rounds record of docs/results/ (`name`: bench/sdpa_compare.py's medians over
    rounds): forward + backward and the backward alone over SDPA flash's, each a span over bf16 and
    fp16, causal and not, \\<prefix>_fb_flash_d64_n512 and \\<prefix>_bwd_flash_d64_n512 (every d and
    N likewise); over cuDNN's pair, \\<prefix>_fb_cudnn_d64; the record's GPU and date,
    \\<prefix>_gpu and \\<prefix>_date ("–" without data)."""
    aliases = OrderedDict()
    grid, gpu, date = {}, "–", "–"
    try:
        with open(os.path.join(results_dir, name), encoding="utf-8") as f:
            for line in f:
                head = re.match(r"^(.+?), (\d{4}-\d{2}-\d{2}): ratios over", line)
                if head and gpu == "–":
                    gpu, date = head.group(1).strip(), head.group(2)
                m = re.match(r"^\s*(bf16|fp16)\s+(\d+)\s+(\d+)\s+(True|False)\s+(.*)$", line)
                medians = re.findall(r"([\d.]+) \[", m.group(5)) if m else []
                if len(medians) >= 5:
                    key = (m.group(1), int(m.group(2)), int(m.group(3)), m.group(4) == "True")
                    grid.setdefault(key, [float(x) for x in medians[:5]])
    except OSError:
        pass
    for d in (64, 128):
        for n in (512, 1024, 2048, 8192):
            vals = [v for k, v in grid.items() if k[1] == d and k[2] == n]
            aliases[f"{prefix}_fb_flash_d{d}_n{n}"] = span_ratios(v[2] for v in vals)
            aliases[f"{prefix}_bwd_flash_d{d}_n{n}"] = span_ratios(v[4] for v in vals)
        aliases[f"{prefix}_fb_cudnn_d{d}"] = span_ratios(v[3] for k, v in grid.items() if k[1] == d)
    aliases[f"{prefix}_gpu"], aliases[f"{prefix}_date"] = gpu, date
    return aliases


def stage09_later_numbers(road09_later, results_dir):
    """The numbers of stage 09's later steps (4 and 5), which its lesson quotes: their record
    (road09_later: read_stage09_steps() of stage09_steps4_quick.txt, steps 4 and 5 beside step 2 in
    one run), each a span over both dtypes, both sizes, causal and not; and Nsight Compute's counters
    of steps 2, 4 and 5 at d = 64 (ncu_stage09_step<s>_d64.txt and _metrics.txt)."""
    aliases = OrderedDict()
    rows = {(r["step"], r["dtype"], r["d"], r["N"], r["causal"]): r for r in (road09_later or {}).get("rows", [])}

    span2 = span_ratios

    def over(a, b, d):
        out = []
        for k, r in rows.items():
            base = rows.get((b,) + k[1:])
            if k[0] == a and k[2] == d and base and r["bwd"] and base["bwd"]:
                out.append(r["bwd"] / base["bwd"])
        return out

    for a, b in ((4, 2), (5, 4)):
        aliases[f"s09_road4_s{a}_over_s{b}_d64"] = span2(over(a, b, 64))
    for step in (2, 4):
        for d in (64, 128):
            pts = [r for k, r in rows.items() if k[0] == step and k[2] == d]
            aliases[f"s09_road4_s{step}_fb_flash_d{d}"] = span2(r["fb_vs_flash"] for r in pts)
            aliases[f"s09_road4_s{step}_bwd_flash_d{d}"] = span2(r["bwd_vs_flash"] for r in pts)
    pts = [r for k, r in rows.items() if k[0] == 4]
    aliases["s09_road4_s4_det"] = span2(r["det_vs_atomic"] for r in pts)
    fb = [r["fb_vs_flash"] for r in pts if r["fb_vs_flash"] is not None]
    below = [x for x in fb if round(x, 2) < 1.0]
    aliases["s09_road4_s4_fb_below"] = f"{len(below)} of {len(fb)}" if fb else "–"
    # The default main kernel (step 4) on the rest of the grid, N 512, 1024, 2048 and 8192, in a run
    # of its own (stage09_grid_step4_ratios_over_rounds.txt: medians over three rounds).
    aliases.update(stage09_grid_numbers(results_dir, "stage09_grid_step4_ratios_over_rounds.txt", "s09_grid"))
    for step in (2, 4, 5):
        metrics = read_ncu_report(results_dir, f"ncu_stage09_step{step}_d64.txt", f"ncu_stage09_step{step}_d64_metrics.txt")
        for key, metric, fmt in (
                ("ms", "Duration", "{:.2f}"),
                ("tensor", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "{:.1f}%"),
                ("mio", "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio", "{:.2f}"),
                ("wait", "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio", "{:.2f}"),
                ("short", "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio", "{:.2f}"),
                ("regs", "Registers Per Thread", "{:.0f}")):
            aliases[f"s09_ncu_step{step}_d64_{key}"] = fmt.format(metrics[metric][0]) if metric in metrics else "–"
        # Per warp and query block: bench_gpu's problem at d = 64, N = 4096 non-causal (B 4, H 32) runs
        # 4096 blocks of 8 warps, each over 32 query blocks.
        warp_blocks = 4096 * 8 * 32
        for key, metric in (("ldsm", "smsp__sass_inst_executed_op_ldsm.sum"),
                            ("wf_ld", "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"),
                            ("wf_st", "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum")):
            aliases[f"s09_ncu_step{step}_d64_{key}"] = f"{metrics[metric][0] / warp_blocks:.0f}" if metric in metrics else "–"
    return aliases


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


def ncu09_side_numbers(results_dir, prefix, reports):
    """Aliases \\<prefix>_<label>_<key> for each (label, report name) of `reports` (an Nsight
    Compute report of docs/results/: its sections `name`.txt and its counters `name`_metrics.txt)
    and each counter of NCU09_SIDE_COUNTERS; '–' where a report or a counter is missing."""
    aliases = OrderedDict()
    for label, name in reports:
        metrics = read_ncu_report(results_dir, name + ".txt", name + "_metrics.txt")  # sections (registers), counters
        for key, counter, fmt, scale in NCU09_SIDE_COUNTERS:
            value = None
            if counter in metrics:
                v, unit = metrics[counter]
                factor = scale if scale is not None else NCU_UNIT_SCALE[key].get(unit)
                value = None if factor is None else v * factor
            aliases[f"{prefix}_{label}_{key}"] = fmt.format(value) if value is not None else "–"
    return aliases


def stage09_over_default_numbers(record, step, prefix, over="over_default"):
    """One step's backward (and forward + backward) over the default main kernel it was timed beside
    (record: read_stage09_steps()), each a span over both dtypes, both sizes, causal and not, per
    head dimension: \\<prefix>_<over>_d64, \\<prefix>_fb_<over>_d64 (d 128 likewise), and at how
    many points its backward was slower, \\<prefix>_slower ("3 of 16")."""
    aliases = OrderedDict()
    rows = [r for r in (record or {}).get("rows", []) if r["step"] == step]
    for d in (64, 128):
        aliases[f"{prefix}_{over}_d{d}"] = span_ratios(r["bwd_vs_default"] for r in rows if r["d"] == d)
        aliases[f"{prefix}_fb_{over}_d{d}"] = span_ratios(r["fb_vs_default"] for r in rows if r["d"] == d)
    slower = [r for r in rows if r["bwd_vs_default"] is not None and round(r["bwd_vs_default"], 2) < 1.0]
    aliases[f"{prefix}_slower"] = f"{len(slower)} of {len(rows)}" if rows else "–"
    return aliases


def stage09_fresh_numbers(road09_fresh, results_dir):
    """The numbers of stage 09's step 6 and of its comparison with SDPA flash's kernel, which its
    lesson quotes: step 6's backward over step 4's, from their run side by side (road09_fresh:
    read_stage09_steps() of stage09_steps6_quick.txt), each a span over both dtypes, both sizes,
    causal and not; Nsight Compute's counters of step 4 beside step 6 (ncu_stage09_step6.txt's
    reports) and of step 4 beside SDPA flash's backward kernel (ncu_flash09.txt's)."""
    aliases = stage09_over_default_numbers(road09_fresh, 6, "s09_road6_s6", "over_s4")
    aliases.update(ncu09_side_numbers(results_dir, "s09_fresh", [
        ("s4_d64", "ncu_stage09_step4_beside6_d64"), ("s6_d64", "ncu_stage09_step6_d64"),
        ("s4_d128", "ncu_stage09_step4_beside6_d128"), ("s6_d128", "ncu_stage09_step6_d128")]))
    aliases.update(ncu09_side_numbers(results_dir, "s09_fa2", [
        ("ours_d64", "ncu_stage09_ours_d64"), ("flash_d64", "ncu_flash_bwd_d64"),
        ("ours_d128", "ncu_stage09_ours_d128"), ("flash_d128", "ncu_flash_bwd_d128")]))
    return aliases


def stage09_tiles_numbers(road09_tiles, results_dir):
    """The numbers of stage 09's steps 9 and 10 (the dQ accumulator in tiles), which its lesson
    quotes: their record (road09_tiles: read_stage09_steps() of stage09_steps910_quick.txt, steps 9
    and 10 beside step 4, the default of then, in one run), each over step 4
    (stage09_over_default_numbers) and over SDPA flash, \\s09_road910_s9_bwd_flash_d64 and
    _fb_flash_d64 (d 128 likewise), and the deterministic mode's time over the atomic one,
    \\s09_road910_s9_det; step 9, the default since, on the grid's other sizes
    (stage09_grid_step9_ratios_over_rounds.txt: \\s09_grid9_*); Nsight Compute's counters of step 4
    beside step 9 (ncu_stage09_step4_beside9_d64 and ncu_stage09_step9_d64, d 128 likewise:
    \\s09_tiles_s4_d64_lg and the like)."""
    aliases = OrderedDict()
    for step in (9, 10):
        prefix = f"s09_road910_s{step}"
        aliases.update(stage09_over_default_numbers(road09_tiles, step, prefix))
        rows = [r for r in (road09_tiles or {}).get("rows", []) if r["step"] == step]
        for d in (64, 128):
            aliases[f"{prefix}_bwd_flash_d{d}"] = span_ratios(r["bwd_vs_flash"] for r in rows if r["d"] == d)
            aliases[f"{prefix}_fb_flash_d{d}"] = span_ratios(r["fb_vs_flash"] for r in rows if r["d"] == d)
        aliases[f"{prefix}_det"] = span_ratios(r["det_vs_atomic"] for r in rows)
    aliases.update(stage09_grid_numbers(results_dir, "stage09_grid_step9_ratios_over_rounds.txt", "s09_grid9"))
    aliases.update(stage09_default_grid_numbers(results_dir))
    aliases.update(ncu09_side_numbers(results_dir, "s09_tiles", [
        ("s4_d64", "ncu_stage09_step4_beside9_d64"), ("s9_d64", "ncu_stage09_step9_d64"),
        ("s4_d128", "ncu_stage09_step4_beside9_d128"), ("s9_d128", "ncu_stage09_step9_d128")]))
    return aliases


def stage10_numbers(results_dir):
    """The numbers stage 10's lesson quotes, from stage10.csv (bench/sdpa_compare.py --stages 10, run
    by bench/gpu_session.sh stage10: each ratio's median over rounds): each a span over both dtypes,
    d 64 and 128 and the sizes timed ("–" without data). Ours / SDPA by rate, \\s10_<variant>_<pass>_<backend>
    (variant gqa8, gqa4, causal, dropout0_1; pass fwd, bwd, fb); a window's time over the plain
    causal kernels' at N = 16384, \\s10_window4095_<pass>_causal; the packed batch's rate over the
    dense kernel's on the uniform batch, \\s10_varlen_<pass>_dense, beside SDPA's nested and padded
    batches, \\s10_varlen_<pass>_<backend>_nested (_padded), and the padded batch's bytes over the
    packed one's, \\s10_varlen_padded_memory; \\s10_gpu and \\s10_date say where and when."""
    rows = [r for r in read_stage10(os.path.join(results_dir, "stage10.csv"), []) or [] if r["value"] is not None]
    short = {"forward": "fwd", "backward": "bwd", "fwd+bwd": "fb"}

    def span(pred):
        return span_ratios(r["value"] for r in rows if pred(r))

    aliases = OrderedDict()
    for variant in ("gqa8", "gqa4", "causal", "dropout0.1"):
        for pass_, tag in short.items():
            for backend in ("flash", "cudnn", "efficient"):
                aliases[f"s10_{variant.replace('.', '_')}_{tag}_{backend}"] = span(
                    lambda r, v=variant, p=pass_, b=backend: (r["kind"], r["variant"], r["pass"], r["other"]) == ("vs_sdpa", v, p, f"sdpa_{b}_{v}"))
    for pass_, tag in short.items():
        aliases[f"s10_window4095_{tag}_causal"] = span(
            lambda r, p=pass_: (r["kind"], r["variant"], r["pass"], r["N"]) == ("vs_causal", "window4095", p, 16384))
        aliases[f"s10_varlen_{tag}_dense"] = span(lambda r, p=pass_: (r["kind"], r["variant"], r["pass"]) == ("vs_dense", "varlen", p))
        for backend in ("flash", "cudnn", "efficient"):
            for layout, name in (("varlen", "nested"), ("padded", "padded")):
                aliases[f"s10_varlen_{tag}_{backend}_{name}"] = span(
                    lambda r, p=pass_, o=f"sdpa_{backend}_{layout}": (r["kind"], r["variant"], r["pass"], r["other"]) == ("vs_sdpa", "varlen", p, o))
    aliases["s10_varlen_padded_memory"] = span(lambda r: r["kind"] == "memory")
    aliases["s10_gpu"] = next((r["gpu"] for r in rows if r.get("gpu")), "–")
    aliases["s10_date"] = next((r["date"] for r in rows if r.get("date")), "–")
    return aliases


def lesson_numbers(gpu, road, results_dir, path, road09=None, road09_later=None, road09_fresh=None, road09_adds=None,
                   road09_tiles=None):
    """The numbers the lessons quote in their prose, as Doxygen aliases (\\s07_gain_swizzle,
    \\ceiling_mma_bf16 and the like) computed from docs/results/: the ceilings of mma_ceiling.jsonl
    and wgmma_ceiling.jsonl (one alias per quantity, for every lesson and the main page), stage 07's
    road.csv (each step's gain), gpu_sweep.csv (stage 07 beside SDPA flash and cuDNN) and its Nsight
    Compute reports, and stage 09's road (`road09`, read_stage09_steps()). Doxygen reads the file
    through @INCLUDE, so the prose and the tables always come from the same run. A number without
    data reads "–"."""
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

    # The tile shapes tried beside the final kernel: their best gain over it, at any shape.
    tried = [r["gain"] for r in road or [] if r["kind"] == "candidate" and r["dtype"] == "bf16" and r["gain"] is not None
             and r["step_name"] != "step 0 in order"]
    aliases["s07_tuning_margin"] = f"{max(0.0, 100 * (max(tried) - 1)):.0f}%" if tried else "–"

    def read_jsonl(name):
        lines = {}
        try:
            with open(os.path.join(results_dir, name), encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        c = json.loads(line)
                        lines[c["name"]] = c
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return lines

    # The ceilings, one alias per quantity (bench/mma_ceiling, bench/wgmma_ceiling). A rate "per SM
    # per clock" is the line's rate divided by its sm_count and by the SM clock the tool read while
    # it ran (its sm_clock_mhz), so a lesson that quotes one quotes that clock too
    # (\ceiling_mma_clock_mhz).
    ceilings, wgmma = read_jsonl("mma_ceiling.jsonl"), read_jsonl("wgmma_ceiling.jsonl")

    def num(lines, name, key, digits):
        try:
            return f"{float(lines[name][key]):.{digits}f}"
        except (KeyError, TypeError, ValueError):
            return "–"

    aliases["ceiling_mma_bf16"] = num(ceilings, "mma_bf16", "value", 0)
    aliases["ceiling_mma_fp16"] = num(ceilings, "mma_fp16", "value", 0)
    aliases["ceiling_mma_per_sm_clock"] = num(ceilings, "mma_bf16", "per_sm_per_clock", 0)
    aliases["ceiling_mma_clock_mhz"] = num(ceilings, "mma_bf16", "sm_clock_mhz", 0)
    aliases["ceiling_sm_count"] = num(ceilings, "mma_bf16", "sm_count", 0)
    aliases["ceiling_ex2"] = num(ceilings, "ex2", "value", 1)
    aliases["ceiling_ex2_per_sm_clock"] = num(ceilings, "ex2", "per_sm_per_clock", 0)
    aliases["ceiling_ffma"] = num(ceilings, "ffma", "value", 1)
    aliases["ceiling_gpu"] = str(ceilings.get("mma_bf16", {}).get("gpu") or "–")
    aliases["ceiling_date"] = str(ceilings.get("mma_bf16", {}).get("date") or "–")
    aliases["ceiling_wgmma_ss_bf16"] = num(wgmma, "wgmma_ss_bf16", "value", 0)
    aliases["ceiling_wgmma_rs_bf16"] = num(wgmma, "wgmma_rs_bf16", "value", 0)
    try:
        over = float(wgmma["wgmma_ss_bf16"]["value"]) / float(ceilings["mma_bf16"]["value"])
        aliases["ceiling_wgmma_over_mma"] = f"{100 * (over - 1):.0f}%"
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        aliases["ceiling_wgmma_over_mma"] = "–"

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
    # Nsight Compute: the road's steps 1 and 2 (ncu_stage07_road.txt), the final kernel (ncu_stage07.txt).
    road_ncu = read_ncu_sections(os.path.join(results_dir, "ncu_stage07_road.txt"))
    final_ncu = read_ncu_sections(os.path.join(results_dir, "ncu_stage07.txt"))

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
    aliases.update(stage09_numbers(ceilings, road09, results_dir))
    aliases.update(stage09_later_numbers(road09_later, results_dir))
    aliases.update(stage09_fresh_numbers(road09_fresh, results_dir))
    for step in (7, 8):
        aliases.update(stage09_over_default_numbers(road09_adds, step, f"s09_road78_s{step}"))
    aliases.update(stage09_tiles_numbers(road09_tiles, results_dir))
    aliases.update(stage10_numbers(results_dir))
    with open(path, "w", encoding="utf-8") as f:
        f.write("# Written by docs/make_results.py from docs/results/: the numbers the lessons quote.\n")
        for k, v in aliases.items():
            f.write(f'ALIASES += "{k}={v}"\n')


def stage07_bridge_table(gpu, road, path):
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
        lines.append("  first, the candidate 'step 0 in order' of bench/gpu_session.sh road" +
                     ("" if in_order else "; not measured yet (–): the next road run fills it in"))
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu-csv", required=True)
    ap.add_argument("--cpu-jsonl", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--images", required=True)
    ap.add_argument("--lesson-pages", default="", help="comma-separated page names the site has (stage01,...)")
    ap.add_argument("--road-csv", help="stage 07's road (default: road.csv beside --gpu-csv)")
    ap.add_argument("--road11-csv", help="stage 11's road (default: road11.csv beside --gpu-csv)")
    ap.add_argument("--stage09-steps", help="stage 09's road: the record of bench/gpu_session.sh quick with STEPS09 "
                    "(default: stage09_steps_quick.txt beside --gpu-csv)")
    ap.add_argument("--lesson-tables", help="folder for the tables the lessons \\verbinclude (stage07_bridge_table.txt, "
                    "stage09_road_table.txt) and lesson_numbers.doxy")
    args = ap.parse_args()
    LESSON_PAGES.update(p for p in args.lesson_pages.split(",") if p)
    os.makedirs(args.images, exist_ok=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    notes, info = [], []
    # Stage 09's rows name the step of its road they ran (impl stage09_step<i> for a step other than
    # the default). A sweep that holds none of the default's rows is shown through the step it has,
    # and the section says which (stage09_section()).
    gpu = read_gpu(args.gpu_csv, notes, info, rename=stage09_shown_step(args.gpu_csv))
    cpu = read_cpu(args.cpu_jsonl, notes)
    road_csv = args.road_csv or os.path.join(os.path.dirname(args.gpu_csv), "road.csv")
    road = read_road(road_csv, notes)
    results_dir = os.path.dirname(args.gpu_csv)
    road11 = read_road(args.road11_csv or os.path.join(results_dir, "road11.csv"), notes)
    road09 = read_stage09_steps(args.stage09_steps or os.path.join(results_dir, "stage09_steps_quick.txt"))
    # The road's later steps, timed in a run of their own beside the default main kernel of then.
    road09_later = read_stage09_steps(os.path.join(results_dir, "stage09_steps4_quick.txt"))
    # Step 6 (offsets afresh), timed in a run of its own beside step 4, the default.
    road09_fresh = read_stage09_steps(os.path.join(results_dir, "stage09_steps6_quick.txt"))
    # Steps 7 and 8 (dQ added one float32 or four at a time), timed beside step 4, the default.
    road09_adds = read_stage09_steps(os.path.join(results_dir, "stage09_steps78_quick.txt"))
    # Steps 9 and 10 (the dQ accumulator in tiles), timed beside step 4, the default of then.
    road09_tiles = read_stage09_steps(os.path.join(results_dir, "stage09_steps910_quick.txt"))
    # The whole road in one run (bench/gpu_session.sh road09): every step beside the default.
    road09_one = read_stage09_steps(os.path.join(results_dir, "stage09_road09.txt"))
    stage10 = read_stage10(os.path.join(results_dir, "stage10.csv"), notes)
    first_contact = read_first_contact(os.path.join(results_dir, "stage11_first_contact.txt"))
    # The second record (steps 4 to 8 added) times the same shapes again: its runs replace the first's.
    later = read_first_contact(os.path.join(results_dir, "stage11_first_contact_road.txt"))
    if later:
        if first_contact is None:
            first_contact = later
        else:
            key = lambda r: (r["step"], r["d"], r["N"], r["causal"])
            newer = {key(r) for r in later["runs"]}
            first_contact["runs"] = [r for r in first_contact["runs"] if key(r) not in newer] + later["runs"]
            first_contact["ceilings"].update(later["ceilings"])
            first_contact["gpu"] = later["gpu"] or first_contact["gpu"]

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

    if args.lesson_tables:
        os.makedirs(args.lesson_tables, exist_ok=True)
        stage07_bridge_table(gpu, road, os.path.join(args.lesson_tables, "stage07_bridge_table.txt"))
        stage09_road_table(road09, os.path.join(args.lesson_tables, "stage09_road_table.txt"))
        stage09_default_grid_table(results_dir, os.path.join(args.lesson_tables, "stage09_default_grid_table.txt"))
        stage09_road_table(road09_later, os.path.join(args.lesson_tables, "stage09_road4_table.txt"),
                           name="docs/results/stage09_steps4_quick.txt")
        stage09_road_table(road09_fresh, os.path.join(args.lesson_tables, "stage09_road6_table.txt"),
                           name="docs/results/stage09_steps6_quick.txt")
        stage09_road_table(road09_adds, os.path.join(args.lesson_tables, "stage09_road78_table.txt"),
                           name="docs/results/stage09_steps78_quick.txt", over_default=True)
        stage09_road_table(road09_tiles, os.path.join(args.lesson_tables, "stage09_road910_table.txt"),
                           name="docs/results/stage09_steps910_quick.txt", over_default=True)
        stage09_road_table(road09_one, os.path.join(args.lesson_tables, "stage09_road_all_table.txt"),
                           name="docs/results/stage09_road09.txt", base=STAGE09_ROAD_BASE,
                           how="bench/gpu_session.sh road09")
        lesson_numbers(gpu, road, results_dir, os.path.join(args.lesson_tables, "lesson_numbers.doxy"), road09,
                       road09_later, road09_fresh, road09_adds, road09_tiles)

    plots = []
    meta = read_gpu_meta(args.gpu_csv)
    # The forward sections read forward rows; the training step's rows (stage 09's of every pass,
    # SDPA's backward and forward + backward) have a section of their own.
    # Stage 11's rows have their own section too (its target is SDPA cuDNN, not flash).
    forward = None if gpu is None else [r for r in gpu if r["pass"] == "forward" and r["impl"] not in STAGE09_IMPLS]
    forward_pre_hopper = None if forward is None else [r for r in forward if r["impl"] != "stage11"]
    gpu_section(forward_pre_hopper, meta, args.images, out, plots)
    stage07_section(forward_pre_hopper, meta, road, args.images, out, plots)
    stage09_section(gpu, args.images, out, plots)
    road09_section(road09, out)
    stage10_section(stage10, args.images, out, plots)
    # Stage 11 beside stage 07 and SDPA in one run: stage11_sweep.csv (bench/gpu_session.sh road11, where
    # step 0 is stage 07's final kernel), else the stage 11 rows of the sweep.
    stage11_csv = os.path.join(results_dir, "stage11_sweep.csv")
    groups_table = os.path.join(results_dir, "stage11_groups_table.txt")
    sweep11 = read_gpu(stage11_csv, notes, info, rename={"stage11_step0": "stage07"})
    if sweep11:
        stage11_section([r for r in sweep11 if r["pass"] == "forward"], read_gpu_meta(stage11_csv), road11, first_contact,
                        groups_table, args.images, out, plots)
    else:
        stage11_section(forward, meta, road11, first_contact, groups_table, args.images, out, plots)
    cpu_section(cpu, args.images, out, plots)
    has_newcomer = newcomer_section(os.path.dirname(args.gpu_csv), out)

    out.append("## Where the data comes from {#results_sources}")
    out.append("")
    out.append("| file | written by | present |")
    out.append("|---|---|---|")
    out.append(f"| `docs/results/gpu_sweep.csv` | the GPU sweep in `bench/` | {'yes' if gpu is not None else 'not yet'} |")
    has_backward = any(r["impl"] in STAGE09_IMPLS for r in gpu or [])
    out.append(f"| `docs/results/gpu_sweep.csv`, rows of pass `backward` and `fwd+bwd` | `bench/gpu_session.sh sweep09` "
               f"(stage 07 + stage 09 beside SDPA) | {'yes' if has_backward else 'not yet'} |")
    out.append(f"| `docs/results/stage09_steps_quick.txt` | `bench/gpu_session.sh quick` with `STEPS09` (stage 09 step by "
               f"step) | {'yes' if road09 is not None else 'not yet'} |")
    out.append(f"| `docs/results/stage10.csv` | `bench/gpu_session.sh stage10` (stage 10's switches beside SDPA) | "
               f"{'yes' if stage10 else 'not yet'} |")
    out.append(f"| `docs/results/road.csv` | `bench/gpu_session.sh road` (stage 07 step by step) | "
               f"{'yes' if road is not None else 'not yet'} |")
    has_stage11 = bool(sweep11) or any(r["impl"] == "stage11" for r in gpu or [])
    out.append(f"| `docs/results/stage11_sweep.csv` (or the stage 11 rows of `gpu_sweep.csv`) | `bench/gpu_session.sh "
               f"road11` (stage 11's final step beside stage 07 and SDPA in one run) | {'yes' if has_stage11 else 'not yet'} |")
    out.append(f"| `docs/results/stage11_groups.csv`, `stage11_groups_table.txt` | `bench/gpu_session.sh groups11` (stage "
               f"11's causal block order, L2 budgets per group of heads) | "
               f"{'yes' if os.path.exists(groups_table) else 'not yet'} |")
    out.append(f"| `docs/results/road11.csv` | `bench/gpu_session.sh road11` (stage 11 step by step) | "
               f"{'yes' if road11 is not None else 'not yet'} |")
    out.append(f"| `docs/results/stage11_first_contact.txt` | `bench/hopper_first_contact.sh` (stage 11's first timings) | "
               f"{'yes' if first_contact is not None else 'not yet'} |")
    out.append(f"| `docs/results/cpu_sweep.jsonl` | the CPU stages with `--bench --json` | "
               f"{'yes' if cpu is not None else 'not yet'} |")
    out.append(f"| `docs/results/newcomer.txt`, `newcomer_test.txt` | `bench/gpu_session.sh newcomer newcomer_test` | "
               f"{'yes' if has_newcomer else 'not yet'} |")
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
