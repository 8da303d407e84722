"""The CPU stages (01 to 04) on the results page, from cpu_sweep.jsonl (each stage's --bench --json
records over a range of N): per (d, mask, B, H) a plot of the memory a stage allocates and of its
time against N, the two as tables, and the course's memory target of stage 04."""

from collections import OrderedDict

from . import plots
from .formatting import fmt_bytes, fmt_num, impl_ref, md, slug, span
from .page import show_plot, targets_table


def plot_cpu(group_rows, stages, title, path):
    """Memory above the inputs (left) and time (right) against N, one line per stage, both on log axes."""
    fig, (ax_mem, ax_time) = plots.plt.subplots(1, 2, figsize=(10.5, 4.2), dpi=110)
    for stage in stages:
        rows = sorted((r for r in group_rows if r["stage"] == stage), key=lambda r: r["Nq"])
        if not rows:
            continue
        label = f"stage {stage}"
        n = [r["Nq"] for r in rows]
        ax_mem.plot(n, [max(r["extra_bytes"], 1.0) / 2**20 for r in rows], marker="o", label=label)
        ax_time.plot(n, [r["median_ms"] for r in rows], marker="o", label=label)
    for ax in (ax_mem, ax_time):
        plots.log2_n_axis(ax)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=9)
    ax_mem.set_ylabel("peak memory above the inputs (MiB)")
    ax_mem.set_title("memory during the run", fontsize=11)
    ax_time.set_ylabel("median time (ms)")
    ax_time.set_title("time", fontsize=11)
    fig.suptitle(title, fontsize=11)
    plots.save(fig, path)



def section(rows, images, out, plots_made):
    """Stages 01 to 04 from cpu_sweep.jsonl's rows (None: no record; []: nothing usable)."""
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
        show_plot(lambda path: plot_cpu(g, stages, f"CPU stages, d = {d}, {mask}, B = {b}, H = {h}", path),
                  f"{anchor}.png", "Peak memory and time against N", images, plots_made, w)
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
    targets(rows, out)


def targets(rows, out):
    """Stage 04's memory at most 5% of stage 01's at N = 16384, on every shape that has both."""
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

