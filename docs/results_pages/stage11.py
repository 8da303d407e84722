"""Stage 11 (Hopper: wgmma, the TMA, warp specialization) on the results page: its side-by-side
run beside stage 07, SDPA flash and cuDNN (stage11_sweep.csv, or the stage 11 rows of
gpu_sweep.csv), its ratios to cuDNN (the target), its road (road11.csv), its default on an H100 and
its causal block order as those runs printed them, and its first timings
(readers.read_first_contacts()) until the sweep has stage 11."""

import os
from collections import OrderedDict

from .formatting import HALF_DTYPES, fmt_num, impl_ref, md, span
from .page import (gpu_sections, ratios_by_shape, road_dtype, road_tables, side_by_side, target_row, targets_table,
                   tflops_table, verbatim_file)

# Stage 11 (Hopper) beside stage 07 and the SDPA backends that run in 16 bits; its target is cuDNN.
STAGE11_IMPLS = ["stage11", "stage07", "sdpa_flash", "sdpa_cudnn"]


def section(rows, meta, road11, first_contact, groups_table, images, out, plots_made):
    """Stage 11 (Hopper) beside stage 07, SDPA flash and cuDNN from gpu_sweep.csv; its ratios to cuDNN
    (the target) and flash; its road from road11.csv. Until the sweep has stage 11, the first timings
    (`bench/session.py run bringup11`) when they are committed."""
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
          "cuDNN backends (`python3 bench/session.py run quick --set quick.stages=07,11`), and "
          "`python3 bench/session.py run road11` times every step of its road.")
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
        ratios_section(side, dtypes, wgmma, out)
    road_section(road11, images, out, plots_made)
    h100_section(os.path.join(os.path.dirname(groups_table), "stage11_sweep_h100_table.txt"), out)
    groups_section(groups_table, out)
    if ours:
        first_contact_table(first_contact, out)


def h100_section(path, out):
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


def groups_section(path, out):
    """Stage 11's causal block order with several L2 budgets per group of heads (the table
    `python3 bench/session.py run groups11` writes), shown as it was measured."""
    w = out.append
    w("### The block order of step 6: groups of heads {#results_stage11_groups}")
    w("")
    if not os.path.exists(path):
        w("\\note Not measured yet: `python3 bench/session.py run groups11` times step 6 with several L2 budgets per group "
          "of heads beside step 5 and writes `docs/results/stage11_groups_table.txt`.")
        w("")
        return
    w("Under a causal mask, step 5 runs the heads one after the other, each from its heaviest query tile; step 6 "
      "takes the heads in groups whose K and V fit an L2 budget and runs each group rank by rank, heaviest first. "
      "`python3 bench/session.py run groups11` times step 6 with several budgets (`FA_STAGE11_GROUP_MIB`; *all*: one group "
      "of every head) beside step 5, bf16, median of 20 runs each; the course's default budget is the one with the "
      "best geometric mean. `docs/results/stage11_groups_table.txt`, as written:")
    w("")
    verbatim_file(path, out)


def first_contact_table(first_contact, out):
    """The first timings of every step of stage 11 (the committed ones taken on 2026-11-23 with
    bench/hopper_first_contact.sh, today `bench/session.py run bringup11`), one column per (d,
    causal), step 0 being stage 07's final kernel."""
    w = out.append
    if not first_contact or not first_contact["runs"]:
        w("No timing of stage 11 is committed yet (`docs/results/stage11_first_contact.txt`, written by "
          "`python3 bench/session.py run bringup11`).")
        w("")
        return
    runs = first_contact["runs"]
    w("### First timings {#results_stage11_first_contact}")
    w("")
    w("The first timings of stage 11, taken on 2026-11-23 before the side-by-side runs above existed, with "
      "`bench/hopper_first_contact.sh` (today `python3 bench/session.py run bringup11`), on "
      f"**{md(first_contact['gpu'] or 'the GPU of the record')}**: "
      f"bf16, N = {', '.join(str(n) for n in sorted({r['N'] for r in runs}))}, each step of the road timed alone "
      "(median of its runs, CUDA events), without SDPA beside it. Step 0 is stage 07's final kernel. Their logs: "
      "`docs/results/stage11_first_contact.txt`, and `stage11_first_contact_road.txt` for the later steps and "
      "timings taken again.")
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


def ratios_section(side, dtypes, wgmma, out):
    """Per dtype: stage 11 / SDPA cuDNN at every shape (the target), with / flash and / stage 07."""
    w = out.append
    w("### Stage 11 against SDPA cuDNN {#results_stage11_ratios}")
    w("")
    idx = {(r["gpu"], r["impl"], r["dtype"], r["N"], r["d"], r["causal"]): r for r in side}
    ratios = []  # stage 11 / cuDNN at every point, for the target
    for t in dtypes:

        def cell(gpu, n, d, causal):
            r = idx.get((gpu, "stage11", t, n, d, causal))
            cu, fl, s7 = (idx.get((gpu, i, t, n, d, causal)) for i in ("sdpa_cudnn", "sdpa_flash", "stage07"))
            if not r:
                return "–"
            text = f"{fmt_num(r['tflops'] / cu['tflops'])}×" if cu else "–"
            if cu:
                ratios.append(((t, n, d, causal), r["tflops"] / cu["tflops"]))
                text = f"**{text}**" if r["tflops"] < cu["tflops"] else text  # below the target: bold
            inner = [f"{fmt_num(r['tflops'] / x['tflops'])}×" for x in (fl, s7) if x]
            text += f" ({', '.join(inner)})" if inner else ""
            return text + (f"<br>{100 * r['tflops'] / wgmma:.0f}%" if wgmma else "")

        ratios_by_shape(side, "stage11", t, f"{t}: stage 11 / SDPA cuDNN, with stage 11 / SDPA flash and stage 11 / "
                        "stage 07 in parentheses" + (" and the fraction of the dense `wgmma` bf16 ceiling below"
                                                     if wgmma else "") + ".", cell, w)
    w("Bold: below SDPA cuDNN, the course's target for stage 11 (≥ 1.0×).")
    w("")
    if ratios:
        targets_table([target_row(f"{impl_ref('stage11')} {'/'.join(dtypes)} / SDPA cuDNN", "≥ 1.0×", ratios,
                                  lambda r: r >= 1.0)], out)


def road_section(road, images, out, plots_made):
    """Stage 11's road from road11.csv: each step's TFLOP/s, its gain over the step before and its
    ratio to SDPA cuDNN."""
    w = out.append
    w("### The road of stage 11 {#results_stage11_road}")
    w("")
    if not road:
        w("\\note The road of stage 11 has not been swept yet: `docs/results/road11.csv` is not there. "
          "`python3 bench/session.py run road11` times every step beside stage 07, SDPA flash and cuDNN and writes it.")
        w("")
        return
    dtype, rows = road_dtype(road)
    w(f"Each step adds one idea to the kernel; step 0 is stage 07's final kernel. {dtype}, measured on "
      f"**{md(span(r['gpu'] for r in rows))}**, SM clock {span((r['sm_clock_mhz'] for r in rows), 'MHz')}, "
      f"{span(r['date'] for r in rows)}. Cells: TFLOP/s, the gain over the step before (× < 1 in bold: the step made "
      "this shape slower), and the ratio to SDPA cuDNN after the slash.")
    w("")
    road_tables(rows, dtype, "stage11", ("road", "sdpa"), images, out, plots_made, vs_cudnn=True)

