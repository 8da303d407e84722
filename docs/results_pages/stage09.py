"""Stage 09 (the backward kernel) on the results page and in its lesson: the training step, stage
07's forward + stage 09's backward, beside SDPA flash and cuDNN (gpu_sweep.csv's backward and
fwd+bwd rows) with its ratios and what deterministic dQ costs; the tables of its road that the
lesson and its record page show (stage09_road*_table.txt, from bench/sdpa_compare.py's tables of
each run: tables.read_stage09_steps) and of its default main kernel on the grid
(stage09_default_grid_table.txt). The numbers its lesson quotes: stage09_numbers.py."""

import os

from . import plots
from .formatting import HALF_DTYPES, fmt_num, impl_name, impl_ref, md, span
from .page import gpu_sections, ratios_by_shape, show_plot
from .tables import beside, read_stage09_pairs, read_stage09_steps

# The training step: stage 07's forward and stage 09's backward ("stage09" rows of every pass; the
# deterministic dQ mode has backward rows of its own), beside SDPA flash and cuDNN. Their rows
# belong to the stage 09 section only, whatever their pass.
STAGE09_IMPLS = ["stage09", "stage09_deterministic"]
BACKWARD_SIDE = ["stage09", "stage09_deterministic", "sdpa_flash", "sdpa_cudnn"]
# Colours match stage 07's plot (ours C0, flash C1, cuDNN C2); the deterministic mode gets C3.
STAGE09_COLOURS = {"stage09": "C0", "sdpa_flash": "C1", "sdpa_cudnn": "C2", "stage09_deterministic": "C3"}

# What writes a record of stage 09's road, named by a road table while its record is missing.
ROAD_QUICK = "python3 bench/session.py run quick --set quick.stages=07,09 --set quick.steps09=..."
# The step each main kernel of stage 09's road changes (attention.cu's road(): "step 4 with ..."):
# the whole road's table gives each step's gain over that one.
STAGE09_ROAD_BASE = {1: 0, 2: 1, 3: 2, 4: 2, 5: 4, 6: 4, 7: 4, 8: 4, 9: 4, 10: 8}
# The records of stage 09's road: bench/sdpa_compare.py's tables of one run each (the default main
# kernel beside SDPA, then each other step beside it), read from X.json beside the printed X.txt
# that the record page shows and the tables cite: (record, its lesson table, road_table()'s options).
ROAD_RECORDS = (
    ("stage09_steps_quick.txt", "stage09_road_table.txt", {}),
    # The road's later steps, timed in a run of their own beside the default main kernel of then.
    ("stage09_steps4_quick.txt", "stage09_road4_table.txt", {}),
    # Step 6 (offsets afresh), timed in a run of its own beside step 4, the default.
    ("stage09_steps6_quick.txt", "stage09_road6_table.txt", {}),
    # Steps 7 and 8 (dQ added one float32 or four at a time), timed beside step 4, the default.
    ("stage09_steps78_quick.txt", "stage09_road78_table.txt", {"over_default": True}),
    # Steps 9 and 10 (the dQ accumulator in tiles), timed beside step 4, the default of then.
    ("stage09_steps910_quick.txt", "stage09_road910_table.txt", {"over_default": True}),
    # The whole road in one run (python3 bench/session.py run road09): every step beside the default.
    ("stage09_road09.txt", "stage09_road_all_table.txt",
     {"base": STAGE09_ROAD_BASE, "how": "python3 bench/session.py run road09"}),
)
# The records of stage 09's default main kernel (step 9) on the grid: the sizes other than 4096 in
# one run, 4096 and 16384 in the road's run of the same day and GPU.
STAGE09_DEFAULT_GRID_RECORDS = ("stage09_grid_step9_quick.txt", "stage09_road09.txt", "stage09_grid_step9_fp16_long.txt")


def read_roads(results_dir, road09_path=None):
    """{record name: read_stage09_steps() of its tables file} for ROAD_RECORDS; `road09_path` (the
    --stage09-steps of make_results.py) stands for the first."""
    roads = {}
    for i, (record, _, _) in enumerate(ROAD_RECORDS):
        path = road09_path if i == 0 and road09_path else os.path.join(results_dir, beside(record))
        roads[record] = read_stage09_steps(path)
    return roads


def plot_stage09(group_rows, title, path):
    """Forward + backward (left) and the backward alone (right): ours and SDPA flash / cuDNN, bf16
    solid and fp16 dashed; the deterministic backward on the right only. One legend for both."""
    names = {"stage09": "ours (stage 07 + 09)", "stage09_deterministic": "ours, deterministic dQ"}
    fig, axes = plots.plt.subplots(1, 2, figsize=(11.5, 4.3), dpi=110)
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
        plots.style_tflops_against_n(ax, heading)
    order = sorted(legend, key=lambda k: (BACKWARD_SIDE.index(legend[k][0]), legend[k][1]))
    axes[1].legend([legend[k][2] for k in order], order, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                   borderaxespad=0)
    fig.suptitle(title, fontsize=11)
    plots.save(fig, path)


def section(rows, images, out, plots_made):
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
          "`python3 bench/session.py run sweep09` times stage 07's forward and stage 09's backward in bf16 and fp16 "
          "beside SDPA's flash and cuDNN backends (forward, backward, and the two together).")
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
        show_plot(lambda path: plot_stage09(g, f"{gpu}: training step, d = {d}, {mask}", path), f"{anchor}.png",
                  f"TFLOP/s against N: forward + backward, and the backward alone, d = {d}, {mask}", images,
                  plots_made, w)
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
    ratios_section(side, dtypes, out)


def ratios_section(side, dtypes, out):
    """Per dtype: ours / SDPA flash (and / cuDNN) forward + backward and backward alone, at every shape;
    then the deterministic backward's time over the atomic one's."""
    w = out.append
    w("### The training step against SDPA {#results_stage09_ratios}")
    w("")
    idx = {(r["gpu"], r["impl"], r["pass"], r["dtype"], r["N"], r["d"], r["causal"]): r for r in side}
    for t in dtypes:

        def cell(gpu, n, d, causal):
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
            return "<br>".join(parts)

        ratios_by_shape(side, "stage09", t, f"{t}: ours / SDPA flash, with ours / SDPA cuDNN in parentheses: forward "
                        "+ backward (f+b), and below it the backward alone (bwd).", cell, w)
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


def road09_section(road09, out):
    """Stage 09's road on the results page: the table its lesson shows, per dtype of the record."""
    w = out.append
    w("### The road of stage 09 {#results_stage09_road}")
    w("")
    if not road09:
        w("\\note The road has not been measured yet: `docs/results/stage09_steps_quick.json` is not there. "
          "`python3 bench/session.py run quick --set quick.stages=07,09 --set quick.steps09=1,2,3` times every main "
          "kernel of stage 09 beside the default one and SDPA flash.")
        w("")
        return
    for t in [t for t in HALF_DTYPES if any(r["dtype"] == t for r in road09["rows"])]:
        w("~~~")
        out.extend(road_table(road09, os.devnull, t))
        w("~~~")
        w("")


def step_order(road09):
    """The steps of the record in order: the default rows first when their step is unknown (None)."""
    return sorted({r["step"] for r in road09["rows"]}, key=lambda s: (-1 if s is None else s))


def road_table(road09, path, dtype="bf16", name="docs/results/stage09_steps_quick.txt", over_default=False,
               base=None, how=ROAD_QUICK):
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
        steps = [s for s in step_order(road09) if any(r["step"] == s for r in rows)]
        cols = sorted({(r["N"], r["causal"]) for r in rows})
        against = ("the default main kernel" if over_default else
                   "the step it changes (/s<step>)" if base else "the step before")
        size = (f"; B*N = {road09['tokens']}, H*d = {road09['width']}"
                if road09["tokens"] is not None and road09["width"] is not None else "")
        lines = [f"stage 09's road, the backward alone, {dtype}: TFLOP/s (its ratio to SDPA flash's backward) "
                 f"x its gain over {against}",
                 f"{road09['gpu']}, {road09['date']}{size}; from {name}"]
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
            span_ = f"x{gains[0]:.2f}" + (f" to x{gains[-1]:.2f}" if f"{gains[-1]:.2f}" != f"{gains[0]:.2f}" else "")
            where = "every column" if len(points) == len(cols) else ", ".join(col for _, col in points)
            lines.append(f"  slower: step {step} {span_}" + (f" of step {before}" if base is not None else "")
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


def default_grid_table(results_dir, path):
    """The lesson's table of the default main kernel on the grid (STAGE09_DEFAULT_GRID_RECORDS'
    stage09_pair tables): one line per point, the ratios the course's targets name."""
    points, gpus, dates = read_stage09_pairs([os.path.join(results_dir, beside(n)) for n in STAGE09_DEFAULT_GRID_RECORDS])
    with open(path, "w", encoding="utf-8") as f:
        if not points:
            f.write("(no record of the default main kernel on the grid is committed)\n")
            return
        f.write(f"{', '.join(gpus)}, {', '.join(dates)}: stage 07 forward + stage 09 backward (default main\n"
                "kernel) beside SDPA. f+b: forward + backward timed as one pair; bwd: the backward alone;\n"
                "det/at: the deterministic backward's time over the atomic one\n\n")
        f.write(f"{'dtype':>5} {'d':>4} {'N':>6} {'causal':>7}  {'f+b TFLOP/s':>11} {'/flash':>7} {'/cudnn':>7}  "
                f"{'bwd TFLOP/s':>11} {'/flash':>7} {'/cudnn':>7}  {'det/at':>6}\n")
        for (dtype, d, n, causal), v in sorted(points.items(), key=lambda kv: kv[0]):
            f.write(f"{dtype:>5} {d:>4} {n:>6} {str(causal):>7}  {v['fb']:>11.1f} {v['fb_vs_flash']:>7.2f} "
                    f"{v['fb_vs_cudnn']:>7.2f}  {v['bwd']:>11.1f} {v['bwd_vs_flash']:>7.2f} {v['bwd_vs_cudnn']:>7.2f}  "
                    f"{v['det_vs_atomic']:>6.2f}\n")
        f.write(f"\nfrom docs/results/{' and '.join(STAGE09_DEFAULT_GRID_RECORDS)}\n"
                "(each point the round of median time, as each run printed it)\n")


def lesson_tables(roads, results_dir, folder):
    """Every table of stage 09 a lesson or record page \\verbinclude's, into `folder`."""
    for record, table, options in ROAD_RECORDS:
        road_table(roads[record], os.path.join(folder, table), name=f"docs/results/{record}", **options)
    default_grid_table(results_dir, os.path.join(folder, "stage09_default_grid_table.txt"))
