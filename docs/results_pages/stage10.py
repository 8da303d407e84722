"""Stage 10 (what real models call: grouped heads, dropout, a sliding window, packed batches of
mixed lengths) on the results page and in its lesson, from stage10.csv (bench/sdpa_compare.py
--stages 10, run by `python3 bench/session.py run stage10`: each ratio the median over rounds, with
the smallest and largest): a table and a plot of every ratio to SDPA, a window's time against the
pairs it keeps, the packed batch beside the dense kernel and SDPA's nested and padded batches, the
course's targets for stage 10, and the numbers its lesson quotes (\\s10_*)."""

from collections import OrderedDict

from . import plots
from .formatting import (HALF_DTYPES, SDPA_NAMES, fmt_bytes, fmt_num, impl_key, lesson_ref, md, pow2_label, slug,
                         span, span_ratios, whole_number)
from .page import section_opening, show_plot, target_row, targets_table

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


def sdpa_backend(other):
    """'sdpa_flash_gqa8' -> ('sdpa_flash', 'gqa8'); a name of ours -> (name, '')."""
    backend, sep, case = other[len("sdpa_"):].partition("_")
    if other.startswith("sdpa_") and sep and case and backend.isascii() and backend.isalpha() and backend.islower():
        return "sdpa_" + backend, case
    return other, ""


def window_left(variant):
    """'window4095' -> 4095, the window's left bound; None for any other variant."""
    return whole_number(variant[len("window"):]) if variant.startswith("window") else None


def variant_name(variant):
    """'gqa8' -> 'grouped 8:1', 'dropout0.1' -> 'dropout 0.1', 'window4095' -> 'window (4095, 0)'."""
    rest = lambda prefix: variant[len(prefix):] if variant.startswith(prefix) else ""
    if whole_number(rest("gqa")) is not None:
        return f"grouped {rest('gqa')}:1"
    if rest("dropout") and all(c.isdigit() or c == "." for c in rest("dropout")) and rest("dropout").isascii():
        return f"dropout {rest('dropout')}"
    if window_left(variant) is not None:
        return f"window ({rest('window')}, 0)"
    return "plain causal" if variant == "causal" else variant


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


def plot_stage10_ratios(idx, variants, points, passes, backend, title, path):
    """Ours / SDPA `backend` by rate, one panel per pass: at each (dtype, d, N) point a dot per
    variant, the median over the rounds with the smallest and largest as its bar; a line at 1.0."""
    fig, axes = plots.plt.subplots(len(passes), 1, figsize=(9.5, 2.3 * len(passes) + 1.0), dpi=110, sharex=True,
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
        plots.style_groups(ax, labels)
    fig.suptitle(title, fontsize=11)
    fig.legend(list(handles.values()), list(handles), loc="upper center", ncol=len(handles), fontsize=9,
               bbox_to_anchor=(0.5, 0.965), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.945))
    fig.savefig(path)
    plots.plt.close(fig)


def plot_stage10_packed(series, groups, passes, title, path):
    """The packed batch's rates, one panel per pass: at each (dtype, d) a bar per series (label,
    colour, hatch, {(pass, dtype, d): TFLOP/s})."""
    fig, axes = plots.plt.subplots(len(passes), 1, figsize=(11.0, 2.3 * len(passes) + 0.6), dpi=110, sharex=True,
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
        plots.style_groups(ax, [f"{t}, d = {d}" for t, d in groups])
    axes[0, 0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.suptitle(title, fontsize=11)
    plots.save(fig, path)


def plot_stage10_window(idx, groups, sizes, passes, share, title, path):
    """A window's time over the plain causal time, one panel per N: at each (dtype, d) a bar per pass
    with the rounds' span; the share of the causal pairs the window keeps (dashed) and, at the
    target's N, the target (dotted)."""
    fig, axes = plots.plt.subplots(1, len(sizes), figsize=(4.8 * len(sizes) + 0.6, 4.0), dpi=110, sharey=True,
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
        plots.style_groups(ax, [f"{t}, d = {d}" for t, d in groups])
        ax.set_ylim(0, None)
    axes[0, 0].set_ylabel("time / causal time")
    handles = OrderedDict()
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    axes[0, -1].legend(list(handles.values()), list(handles), fontsize=8, loc="upper left",
                       bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.suptitle(title, fontsize=11)
    plots.save(fig, path)


def section(rows, images, out, plots_made):
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
          "(`python3 bench/session.py run stage10` writes it).")
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
      f"{span(r['date'] for r in rows)}, by `bench/sdpa_compare.py --stages 10` (`python3 bench/session.py run stage10`); "
      "`docs/results/stage10.txt` holds the same data as a text table.")
    if dense:
        w(f"The dense problems are causal, with B·N = {span(r['B'] * r['N'] for r in dense)} tokens and H·d = "
          f"{span(r['H'] * r['d'] for r in dense)} (H counts the query heads), dtypes {span(r['dtype'] for r in dense)}.")
    w("Rates count the visible (query, key) pairs only. Each ratio is taken between the two timings of one round; "
      f"the tables show its median over the rounds ({span(r['rounds'] for r in rows if r['rounds'])} rounds) with "
      "the smallest and largest in brackets" + (", and the plots draw the same span as a bar." if plots.HAVE_MPL else "."))
    w("")
    sdpa_section(dense, images, out, plots_made)
    window_section([r for r in rows if r["kind"] == "vs_causal"], images, out, plots_made)
    packed_section([r for r in rows if r["variant"].startswith("varlen") or r["kind"] == "memory"], images, out,
                   plots_made)
    targets(rows, out)


def sdpa_section(rows, images, out, plots_made):
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
         if plots.HAVE_MPL and backends else ""))
    w("")
    for b in backends:
        show_plot(lambda path, b=b: plot_stage10_ratios(idx, variants, points, passes, b, f"stage 10 / {SDPA_NAMES[b]} "
                                                        "by rate, median over the rounds (bar: smallest to largest)", path),
                  f"results_stage10_vs_{b[len('sdpa_'):]}.png",
                  f"Ours / {SDPA_NAMES[b]} by rate, per pass, variant and (dtype, d, N)", images, plots_made, w)
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


def window_section(rows, images, out, plots_made):
    """A window's time over the plain causal kernels' at the same N, beside the share of the causal
    pairs it keeps, computed from N and the window."""
    w = out.append
    if not section_opening(w, "### A sliding window against causal {#results_stage10_window}", rows,
                           "`stage10.csv` has no window timed against the plain causal kernels."):
        return
    for variant in sorted({r["variant"] for r in rows}):
        vrows = [r for r in rows if r["variant"] == variant]
        left = window_left(variant)
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
                                                   else ".") if plots.HAVE_MPL and share else ""))
        w("")
        if share:
            show_plot(lambda path: plot_stage10_window(idx, groups, sizes, passes, share, f"{variant_name(variant)}: "
                                                       "time over the plain causal time, median over the rounds (bar: "
                                                       "smallest to largest)", path),
                      f"results_stage10_{slug(variant)}.png", f"Time of the {variant_name(variant)} over the plain "
                      "causal time, beside the share of the causal pairs it keeps", images, plots_made, w)
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


def packed_section(rows, images, out, plots_made):
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
         if plots.HAVE_MPL else ""))
    w("")
    if plots.HAVE_MPL:
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
        show_plot(lambda path: plot_stage10_packed(series, groups, passes, "the packed batch: TFLOP/s of the visible "
                                                   "pairs", path), "results_stage10_packed.png",
                  "TFLOP/s of the packed batch beside the dense kernel and SDPA's nested and padded batches, per pass",
                  images, plots_made, w)
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
        memory.setdefault((r["dtype"], r["d"], r["N"], r["B"]), r)
    if memory:
        w("Memory: SDPA's padded batch (q, k, v, o and the mask) over the packed one (q, k, v, o):")
        w("")
        w("| dtype | d | tokens | sequences | padded | packed | padded / packed |")
        w("|---|---:|---:|---:|---:|---:|---:|")
        for (t, d, n, b), r in memory.items():
            padded, packed = ((fmt_bytes(r["padded_bytes"]), fmt_bytes(r["packed_bytes"]))
                              if r["padded_bytes"] is not None and r["packed_bytes"] is not None else ("–", "–"))
            w(f"| {t} | {d} | {n} | {b} | {padded} | {packed} | {fmt_num(r['value'])}× |")
        w("")


def targets(rows, out):
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
        if window_left(v) is not None:
            share = window_share(n, window_left(v))
            w(f"The {variant_name(v)} keeps {share:.4f} of the causal (query, key) pairs at N = {n} (kept pairs "
              "over causal pairs, counted from N and the window). That share is the floor of its time over the "
              f"causal time at the causal kernels' rate; the goal of {STAGE10_WINDOW_TARGET}× lies "
              + ("below it: no kernel that computes every pair the window keeps can meet it at this N."
                 if share > STAGE10_WINDOW_TARGET else "above it."))
            w("")


def aliases(rows):
    """The numbers stage 10's lesson quotes, from stage10.csv's rows (read_stage10()): each a span over both dtypes,
    d 64 and 128 and the sizes timed ("–" without data). Ours / SDPA by rate, \\s10_<variant>_<pass>_<backend>
    (variant gqa8, gqa4, causal, dropout0_1; pass fwd, bwd, fb); a window's time over the plain
    causal kernels' at N = 16384, \\s10_window4095_<pass>_causal; the packed batch's rate over the
    dense kernel's on the uniform batch, \\s10_varlen_<pass>_dense, beside SDPA's nested and padded
    batches, \\s10_varlen_<pass>_<backend>_nested (_padded), and the padded batch's bytes over the
    packed one's, \\s10_varlen_padded_memory; \\s10_gpu and \\s10_date say where and when."""
    rows = [r for r in rows or [] if r["value"] is not None]
    short = {"forward": "fwd", "backward": "bwd", "fwd+bwd": "fb"}

    def span_of(pred):
        return span_ratios(r["value"] for r in rows if pred(r))

    numbers = OrderedDict()
    for variant in ("gqa8", "gqa4", "causal", "dropout0.1"):
        for pass_, tag in short.items():
            for backend in ("flash", "cudnn", "efficient"):
                numbers[f"s10_{variant.replace('.', '_')}_{tag}_{backend}"] = span_of(
                    lambda r, v=variant, p=pass_, b=backend: (r["kind"], r["variant"], r["pass"], r["other"]) == ("vs_sdpa", v, p, f"sdpa_{b}_{v}"))
    for pass_, tag in short.items():
        numbers[f"s10_window4095_{tag}_causal"] = span_of(
            lambda r, p=pass_: (r["kind"], r["variant"], r["pass"], r["N"]) == ("vs_causal", "window4095", p, 16384))
        numbers[f"s10_varlen_{tag}_dense"] = span_of(lambda r, p=pass_: (r["kind"], r["variant"], r["pass"]) == ("vs_dense", "varlen", p))
        for backend in ("flash", "cudnn", "efficient"):
            for layout, name in (("varlen", "nested"), ("padded", "padded")):
                numbers[f"s10_varlen_{tag}_{backend}_{name}"] = span_of(
                    lambda r, p=pass_, o=f"sdpa_{backend}_{layout}": (r["kind"], r["variant"], r["pass"], r["other"]) == ("vs_sdpa", "varlen", p, o))
    numbers["s10_varlen_padded_memory"] = span_of(lambda r: r["kind"] == "memory")
    numbers["s10_gpu"] = next((r["gpu"] for r in rows if r.get("gpu")), "–")
    numbers["s10_date"] = next((r["date"] for r in rows if r.get("date")), "–")
    return numbers
