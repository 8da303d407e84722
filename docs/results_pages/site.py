"""The results page and the lessons' files in one pass: every record of docs/results/ read once,
then the page's sections in course order (each stage's module writes its own), the table of where
the data comes from, and, with --lesson-tables, the tables the lessons \\verbinclude and the
numbers they quote (lesson_numbers.doxy)."""

import os

from . import cpu, newcomer, plots, stage05_06, stage07, stage09, stage09_numbers, stage10, stage11
from .ceilings import ceiling_aliases
from .formatting import LESSON_PAGES
from .readers import (read_cpu, read_first_contacts, read_gpu, read_gpu_meta, read_jsonl_by_name, read_road,
                      read_stage10, stage09_shown_step)
from .stage09 import STAGE09_IMPLS


def read_records(args):
    """Every record the page and the lessons use, as the readers give them; `notes` (warnings) and
    `info` (notes) say what was skipped."""
    notes, info = [], []
    results_dir = os.path.dirname(args.gpu_csv)
    rec = {"notes": notes, "info": info, "results_dir": results_dir}
    # Stage 09's rows name the step of its road they ran (impl stage09_step<i> for a step other than
    # the default). A sweep that holds none of the default's rows is shown through the step it has,
    # and the section says which (stage09.section()).
    rec["gpu"] = read_gpu(args.gpu_csv, notes, info, rename=stage09_shown_step(args.gpu_csv))
    rec["cpu"] = read_cpu(args.cpu_jsonl, notes)
    rec["road"] = read_road(args.road_csv or os.path.join(results_dir, "road.csv"), notes)
    rec["road11"] = read_road(args.road11_csv or os.path.join(results_dir, "road11.csv"), notes)
    rec["roads09"] = stage09.read_roads(results_dir, args.stage09_steps)
    rec["stage10"] = read_stage10(os.path.join(results_dir, "stage10.csv"), notes)
    rec["first_contact"] = read_first_contacts(results_dir)
    # Stage 11 beside stage 07 and SDPA in one run: stage11_sweep.csv (python3 bench/session.py run
    # road11, where step 0 is stage 07's final kernel), else the stage 11 rows of the sweep.
    rec["stage11_csv"] = os.path.join(results_dir, "stage11_sweep.csv")
    rec["sweep11"] = read_gpu(rec["stage11_csv"], notes, info, rename={"stage11_step0": "stage07"})
    rec["ceilings"] = read_jsonl_by_name(os.path.join(results_dir, "mma_ceiling.jsonl"))
    rec["wgmma"] = read_jsonl_by_name(os.path.join(results_dir, "wgmma_ceiling.jsonl"))
    return rec


def lesson_aliases(rec):
    """Every alias the lessons quote, in the order lesson_numbers.doxy lists them."""
    aliases = stage07.road_aliases(rec["road"])
    aliases.update(ceiling_aliases(rec["ceilings"], rec["wgmma"]))
    aliases.update(stage07.sweep_aliases(rec["gpu"], rec["ceilings"], rec["results_dir"]))
    aliases.update(stage09_numbers.aliases(rec["ceilings"], rec["roads09"], rec["results_dir"]))
    aliases.update(stage10.aliases(rec["stage10"]))
    return aliases


def write_lesson_files(rec, folder):
    """The tables the lessons \\verbinclude (stage07_bridge_table.txt, stage09_*_table.txt) and
    lesson_numbers.doxy, the numbers they quote in their prose as Doxygen aliases (\\s07_gain_swizzle,
    \\ceiling_mma_bf16 and the like). Doxygen reads the aliases through @INCLUDE, so the prose and
    the tables always come from the same run. A number without data reads "–"."""
    os.makedirs(folder, exist_ok=True)
    stage07.bridge_table(rec["gpu"], rec["road"], os.path.join(folder, "stage07_bridge_table.txt"))
    stage09.lesson_tables(rec["roads09"], rec["results_dir"], folder)
    with open(os.path.join(folder, "lesson_numbers.doxy"), "w", encoding="utf-8") as f:
        f.write("# Written by docs/make_results.py from docs/results/: the numbers the lessons quote.\n")
        for k, v in lesson_aliases(rec).items():
            f.write(f'ALIASES += "{k}={v}"\n')


def sources_table(rec, has_newcomer, out):
    """Which record each section reads, what writes it, and whether it is there."""
    gpu, results_dir = rec["gpu"], rec["results_dir"]
    yes = lambda present: "yes" if present else "not yet"
    has_backward = any(r["impl"] in STAGE09_IMPLS for r in gpu or [])
    has_stage11 = bool(rec["sweep11"]) or any(r["impl"] == "stage11" for r in gpu or [])
    groups = os.path.exists(os.path.join(results_dir, "stage11_groups_table.txt"))
    run = lambda exp: f"`python3 bench/session.py run {exp}`"
    rows = [
        ("`docs/results/gpu_sweep.csv`", "the GPU sweep in `bench/`", gpu is not None),
        ("`docs/results/gpu_sweep.csv`, rows of pass `backward` and `fwd+bwd`",
         f"{run('sweep09')} (stage 07 + stage 09 beside SDPA)", has_backward),
        ("`docs/results/stage09_steps_quick.txt`",
         f"{run('quick')} with `--set quick.steps09=...` (stage 09 step by step)",
         rec["roads09"]["stage09_steps_quick.txt"] is not None),
        ("`docs/results/stage10.csv`", f"{run('stage10')} (stage 10's switches beside SDPA)", rec["stage10"]),
        ("`docs/results/road.csv`", f"{run('road')} (stage 07 step by step)", rec["road"] is not None),
        ("`docs/results/stage11_sweep.csv` (or the stage 11 rows of `gpu_sweep.csv`)",
         f"{run('road11')} (stage 11's final step beside stage 07 and SDPA in one run)", has_stage11),
        ("`docs/results/stage11_groups.csv`, `stage11_groups_table.txt`",
         f"{run('groups11')} (stage 11's causal block order, L2 budgets per group of heads)", groups),
        ("`docs/results/road11.csv`", f"{run('road11')} (stage 11 step by step)", rec["road11"] is not None),
        ("`docs/results/stage11_first_contact.txt`", f"{run('bringup11')} (stage 11's first timings)",
         rec["first_contact"] is not None),
        ("`docs/results/cpu_sweep.jsonl`", "the CPU stages with `--bench --json`", rec["cpu"] is not None),
        ("`docs/results/newcomer.txt`, `newcomer_test.txt`", run("newcomer newcomer_test"), has_newcomer),
    ]
    out.append("## Where the data comes from {#results_sources}")
    out.append("")
    out.append("| file | written by | present |")
    out.append("|---|---|---|")
    out.extend(f"| {name} | {writer} | {yes(present)} |" for name, writer, present in rows)
    out.append("")


def write_site(args):
    """make_results.py's work, from its parsed command line."""
    LESSON_PAGES.update(p for p in args.lesson_pages.split(",") if p)
    os.makedirs(args.images, exist_ok=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    rec = read_records(args)
    gpu, results_dir = rec["gpu"], rec["results_dir"]

    out = ["# Measured results {#results}", ""]
    out.append("Every number on this page is read from `docs/results/` and turned into tables and plots by "
               "`docs/make_results.py` each time the docs are built: nothing here is typed by hand. "
               "The lessons explain the numbers; this page collects them in one place, with the machine "
               "and the date they were measured on.")
    out.append("")
    out.append("[TOC]")
    out.append("")
    if not plots.HAVE_MPL:
        out.append("\\note The plots need matplotlib (`sudo apt-get install python3-matplotlib`); "
                   "this build has tables only.")
        out.append("")
    for n in rec["notes"]:
        out.extend([f"\\warning {n}", ""])
    for n in rec["info"]:
        out.extend([f"\\note {n}", ""])
    if args.lesson_tables:
        write_lesson_files(rec, args.lesson_tables)

    made = []  # the plots the page shows
    meta = read_gpu_meta(args.gpu_csv)
    # The forward sections read forward rows; the training step's rows (stage 09's of every pass,
    # SDPA's backward and forward + backward) have a section of their own.
    # Stage 11's rows have their own section too (its target is SDPA cuDNN, not flash).
    forward = None if gpu is None else [r for r in gpu if r["pass"] == "forward" and r["impl"] not in STAGE09_IMPLS]
    forward_pre_hopper = None if forward is None else [r for r in forward if r["impl"] != "stage11"]
    stage05_06.gpu_section(forward_pre_hopper, meta, args.images, out, made)
    stage07.section(forward_pre_hopper, meta, rec["road"], args.images, out, made)
    stage09.section(gpu, args.images, out, made)
    stage09.road09_section(rec["roads09"]["stage09_steps_quick.txt"], out)
    stage10.section(rec["stage10"], args.images, out, made)
    groups_table = os.path.join(results_dir, "stage11_groups_table.txt")
    if rec["sweep11"]:
        stage11.section([r for r in rec["sweep11"] if r["pass"] == "forward"], read_gpu_meta(rec["stage11_csv"]),
                        rec["road11"], rec["first_contact"], groups_table, args.images, out, made)
    else:
        stage11.section(forward, meta, rec["road11"], rec["first_contact"], groups_table, args.images, out, made)
    cpu.section(rec["cpu"], args.images, out, made)
    has_newcomer = newcomer.section(results_dir, out)
    sources_table(rec, has_newcomer, out)

    # Remove plots of groups that are gone, so the image folder holds only what the page shows.
    for f in os.listdir(args.images):
        if f.startswith("results_") and f.endswith(".png") and f not in made:
            os.remove(os.path.join(args.images, f))
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
