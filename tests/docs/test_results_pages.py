#!/usr/bin/env python3
"""docs/results_pages without a GPU: each reader of a record kind on small records cut from the
real ones (tests/docs/fixtures/results/: the sweeps' CSV and JSON, the roads, the CPU sweep,
sdpa_compare.py's tables files, stage10.csv, stage 11's first timings, the ceilings, the newcomer
records) gives the numbers the pages use; and the aliases and tables made from docs/results/ hold
every alias and table the lessons use, none of them empty.

    python3 tests/docs/test_results_pages.py

Standard library only (matplotlib is not needed: no plot is drawn).
"""
import argparse
import glob
import json
import os
import re
import shutil
import sys
import tempfile
import unittest
import unittest.mock

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(REPO, "tests", "docs", "fixtures", "results")
sys.path[:0] = [os.path.join(REPO, "bench"), os.path.join(REPO, "docs")]  # as docs/make_results.py does

import records  # noqa: E402
from results_pages import ceilings, newcomer, plots, readers, site, stage09, stage09_numbers, stage10, tables  # noqa: E402

H100 = "NVIDIA H100 80GB HBM3"


def fixture(name):
    return os.path.join(FIXTURES, name)


class TempDir(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="results_pages_")

    def tearDown(self):
        shutil.rmtree(self.tmp)


class SweepReaders(TempDir):
    def test_gpu_sweep_rows(self):
        notes, info = [], []
        rows = readers.read_gpu(fixture("gpu_sweep.csv"), notes, info,
                                rename=readers.stage09_shown_step(fixture("gpu_sweep.csv")))
        by = {(r["impl"], r["dtype"], r["pass"]): r for r in rows}
        self.assertEqual(len(rows), 6)
        ours = by[("stage07", "bf16", "forward")]
        self.assertEqual((ours["B"], ours["H"], ours["N"], ours["d"], ours["causal"]), (4, 32, 4096, 64, False))
        self.assertEqual((ours["median_ms"], ours["tflops"], ours["sm_clock_mhz"]), (1.60539, 342.443, "1980"))
        # Stage 09's step 0 is all the sweep has: it is shown as the default, its step named.
        self.assertEqual(by[("stage09", "bf16", "backward")]["step"], "0")
        self.assertEqual(by[("stage09_deterministic", "bf16", "backward")]["tflops"], 96.4759)
        self.assertEqual(notes, ["1 malformed line(s) of `gpu_sweep.csv` were skipped."])
        self.assertEqual(len(info), 1)
        self.assertTrue(info[0].startswith("1 row(s) of `gpu_sweep.csv` have no time"))

    def test_a_road_step_is_left_out_unless_renamed(self):
        plain = readers.read_gpu(fixture("gpu_sweep.csv"), [], [])
        self.assertNotIn("stage09", {r["impl"] for r in plain})
        self.assertNotIn("stage09_step0", {r["impl"] for r in plain})
        sweep11 = readers.read_gpu(fixture("stage11_sweep.csv"), [], [], rename={"stage11_step0": "stage07"})
        self.assertEqual({r["impl"]: r["tflops"] for r in sweep11},
                         {"stage11": 535.015, "stage07": 342.816, "sdpa_cudnn": 482.703})

    def test_missing_and_short_records(self):
        self.assertIsNone(readers.read_gpu(os.path.join(self.tmp, "gpu_sweep.csv"), [], []))
        path = os.path.join(self.tmp, "short.csv")
        with open(path, "w", encoding="utf-8") as f:
            f.write("impl,dtype\nstage07,bf16\n")
        notes = []
        self.assertEqual(readers.read_gpu(path, notes, []), [])
        self.assertIn("lacks the columns B, H, N", notes[0])

    def test_gpu_meta_and_ceilings(self):
        meta = readers.read_gpu_meta(fixture("gpu_sweep.csv"))
        self.assertEqual((meta["gpu"], meta["torch"], meta["max_sm_clock_mhz"]), (H100, "2.11.0+cu130", "1980"))
        self.assertEqual(readers.mma_ceiling(meta), 665.898)
        self.assertEqual(readers.mma_ceiling(meta, "fp16"), 666.612)
        self.assertEqual(meta["wgmma_ceiling_tflops"], 940.082)  # from wgmma_ceiling.jsonl beside it
        # Without the sweep's record, the ceilings come from mma_ceiling.jsonl.
        shutil.copy(fixture("mma_ceiling.jsonl"), self.tmp)
        meta = readers.read_gpu_meta(os.path.join(self.tmp, "gpu_sweep.csv"))
        self.assertEqual(readers.mma_ceiling(meta), 665.898)
        self.assertIsNone(readers.mma_ceiling({}))

    def test_ceilings_jsonl_and_aliases(self):
        mma = readers.read_jsonl_by_name(fixture("mma_ceiling.jsonl"))
        wgmma = readers.read_jsonl_by_name(fixture("wgmma_ceiling.jsonl"))
        self.assertEqual(sorted(mma), ["mma_bf16", "mma_fp16"])
        self.assertEqual(mma["mma_bf16"]["per_sm_per_clock"], 2547.82)
        aliases = ceilings.ceiling_aliases(mma, wgmma)
        self.assertEqual(aliases["ceiling_mma_bf16"], "666")
        self.assertEqual(aliases["ceiling_mma_per_sm_clock"], "2548")
        self.assertEqual(aliases["ceiling_sm_count"], "132")
        self.assertEqual(aliases["ceiling_wgmma_ss_bf16"], "940")
        self.assertEqual(aliases["ceiling_wgmma_over_mma"], "41%")  # 940.082 / 665.898
        self.assertEqual(aliases["ceiling_ex2"], "–")  # not in these lines
        self.assertEqual(readers.read_jsonl_by_name(os.path.join(self.tmp, "none.jsonl")), {})

    def test_roads(self):
        road = readers.read_road(fixture("road.csv"), [])
        self.assertEqual([(r["kind"], r["step"]) for r in road], [("road", 0), ("road", 1), ("candidate", 9), ("sdpa", None)])
        self.assertIsNone(road[0]["gain"])
        self.assertEqual((road[1]["step_name"], road[1]["tflops"], road[1]["gain"]), ("ldmatrix", 45.0485, 0.981887))
        road11 = readers.read_road(fixture("road11.csv"), [])
        self.assertEqual([r["vs_cudnn"] for r in road11], [0.71577, 0.483367, 1.0])
        self.assertEqual(road11[1]["gain"], 0.675311)

    def test_cpu_sweep(self):
        notes = []
        rows = readers.read_cpu(fixture("cpu_sweep.jsonl"), notes)
        self.assertEqual([r["stage"] for r in rows], ["01", "04"])
        self.assertEqual(rows[0]["extra_bytes"], 5402624 - 4587520)  # peak RSS less what was held before
        self.assertEqual((rows[1]["median_ms"], rows[1]["gflops"], rows[1]["pass"]), (0.198659, 84.4523, True))
        self.assertEqual(notes, ["1 malformed line(s) of `cpu_sweep.jsonl` were skipped."])

    def test_stage10(self):
        rows = readers.read_stage10(fixture("stage10.csv"), [])
        by = {(r["kind"], r["other"]): r for r in rows}
        gqa = by[("vs_sdpa", "sdpa_flash_gqa8")]
        self.assertEqual((gqa["value"], gqa["lo"], gqa["hi"], gqa["rounds"]), (1.12876, 1.10126, 1.13276, 3))
        refused = by[("vs_sdpa", "sdpa_efficient_gqa4")]
        self.assertIsNone(refused["value"])
        self.assertTrue(refused["note"].startswith("unsupported"))
        memory = by[("memory", "sdpa_flash_padded")]
        self.assertEqual((memory["padded_bytes"], memory["packed_bytes"]), (957930960, 268435456))
        self.assertIsNone(gqa["padded_bytes"])
        # A record from before the byte columns: the memory table shows "–" there.
        path = os.path.join(self.tmp, "stage10.csv")
        with open(fixture("stage10.csv"), encoding="utf-8") as f, open(path, "w", encoding="utf-8") as g:
            for line in f:
                g.write(line.rstrip("\n").rsplit(",", 2)[0] + "\n")
        self.assertTrue(all(r["padded_bytes"] is None for r in readers.read_stage10(path, [])))

    def test_stage10_aliases(self):
        aliases = stage10.aliases(readers.read_stage10(fixture("stage10.csv"), []))
        self.assertEqual(aliases["s10_gqa8_fwd_flash"], "1.13")
        self.assertEqual(aliases["s10_gqa4_fwd_efficient"], "–")  # SDPA refused it
        self.assertEqual(aliases["s10_varlen_fwd_dense"], "1.04")
        self.assertEqual(aliases["s10_varlen_padded_memory"], "3.57")
        self.assertEqual(aliases["s10_window4095_fwd_causal"], "–")  # timed at N = 4096, the alias is N = 16384's
        self.assertEqual((aliases["s10_gpu"], aliases["s10_date"]), (H100, "2026-11-27"))

    def test_first_contact(self):
        first = readers.read_first_contact(fixture("stage11_first_contact.json"))
        self.assertEqual(first["gpu"], H100)
        self.assertEqual([(r["step"], r["step_name"], r["d"], r["N"], r["causal"], r["tflops"]) for r in first["runs"]],
                         [(0, "stage 07's final kernel", 64, 4096, False, 321.46), (1, "wgmma", 64, 4096, False, 217.83)])
        self.assertEqual(first["ceilings"], {"wgmma_ss_bf16": 915.6, "wgmma_ss_fp16": 890.7})
        # The second record times step 0 again and adds step 4: its runs and ceilings win.
        merged = readers.read_first_contacts(FIXTURES)
        self.assertEqual([(r["step"], r["tflops"]) for r in merged["runs"]], [(1, 217.83), (0, 321.38), (4, 397.31)])
        self.assertEqual(merged["ceilings"]["wgmma_ss_bf16"], 887.4)
        self.assertIsNone(readers.read_first_contacts(self.tmp))
        path = os.path.join(self.tmp, "stage11_first_contact.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"runs": []}, f)
        self.assertRaises(ValueError, readers.read_first_contact, path)

    def test_newcomer(self):
        out = []
        self.assertTrue(newcomer.section(FIXTURES, out))
        self.assertEqual(out.count("~~~"), 4)  # both records, each fenced
        self.assertIn("date:     2026-11-27 22:44 UTC", out)
        self.assertEqual(newcomer.records(self.tmp), [])
        self.assertFalse(newcomer.section(self.tmp, []))


class TablesFiles(TempDir):
    """sdpa_compare.py's tables files (bench/records.py): a record converted from its printed text
    and a run's tables.json read alike."""

    def test_stage09_steps(self):
        road = tables.read_stage09_steps(fixture("stage09_steps4_quick.json"))
        self.assertEqual((road["gpu"], road["date"], road["default_step"]), (H100, "2026-11-25", 2))
        self.assertEqual((road["tokens"], road["width"]), (16384, 2048))
        rows = {(r["step"], r["dtype"], r["d"], r["N"], r["causal"]): r for r in road["rows"]}
        self.assertEqual(sorted({k[0] for k in rows}), [2, 4, 5])
        pair = rows[(2, "bf16", 64, 4096, False)]  # the default main kernel's row (stage09_pair)
        self.assertEqual((pair["kind"], pair["fb"], pair["fb_cudnn_tflops"], pair["bwd_vs_flash"]),
                         ("default", 268.0, 440.6, 0.9))
        step = rows[(4, "bf16", 64, 4096, True)]  # a step's own table (stage09_step)
        self.assertEqual((step["kind"], step["bwd"], step["bwd_vs_default"], step["bad"]), ("step", 242.4, 1.09, False))

    def test_a_step_timed_by_its_backward_alone(self):
        road = tables.read_stage09_steps(fixture("stage09_road09.json"))
        self.assertEqual(road["default_step"], 9)
        step0 = [r for r in road["rows"] if r["step"] == 0]
        self.assertEqual(len(step0), 2)
        self.assertTrue(all(r["fb"] is None and r["det_ms"] is None for r in step0))  # printed "-"
        self.assertEqual(sorted(r["bwd"] for r in step0), [203.3, 216.7])

    def run_file(self, run, name="tables.json"):
        path = os.path.join(self.tmp, name)
        records.write_tables(path, run)
        return path

    def test_a_step_table_wins_over_the_default_rows(self):
        pair = records.Table("stage09_pair", records.STAGE09_PAIR, {"dtype": "bf16"})
        pair.add(64, 4096, False, *[1.0] * 11, False)
        step = records.Table("stage09_step", records.STAGE09_STEP, {"dtype": "bf16", "impl": "stage09_step4", "step": 4})
        step.add(64, 4096, False, *[2.0] * 9, True)
        path = self.run_file(records.Run({"gpu": "G", "date": "D", "default_steps": {"09": 4}}, [pair, step]))
        road = tables.read_stage09_steps(path)
        self.assertEqual(len(road["rows"]), 1)
        self.assertEqual((road["rows"][0]["kind"], road["rows"][0]["bwd"], road["rows"][0]["bad"]), ("step", 2.0, True))
        self.assertIsNone(road["tokens"])  # the run does not say its size

    def test_stage09_pairs_first_run_wins(self):
        points, gpus, dates = tables.read_stage09_pairs([fixture("stage09_steps4_quick.json"), fixture("stage09_road09.json")])
        self.assertEqual(points[("bf16", 64, 4096, False)]["fb"], 268.0)  # steps4's, listed first
        self.assertEqual((gpus, dates), ([H100, "NVIDIA H200"], ["2026-11-25", "2026-11-26"]))

    def test_ratios(self):
        grid, meta = tables.read_ratios(fixture("stage09_grid_step9_ratios_over_rounds.json"))
        self.assertEqual((meta["gpu"], meta["rounds"]), ("NVIDIA H200", 3))
        self.assertEqual(len(grid), 8)
        self.assertEqual(grid[("bf16", 64, 512, False)]["stage09/sdpa_flash/fwd+bwd"], [1.24, 1.24, 1.24])
        aliases = stage09_numbers.grid_numbers(FIXTURES, "stage09_grid_step9_ratios_over_rounds.txt", "g")
        self.assertEqual(aliases["g_fb_flash_d64_n512"], "1.23 to 1.33")
        self.assertEqual(aliases["g_bwd_flash_d64_n1024"], "1.19 to 1.27")
        self.assertEqual(aliases["g_fb_flash_d128_n512"], "–")
        self.assertEqual((aliases["g_gpu"], aliases["g_date"]), ("NVIDIA H200", "2026-11-26"))

    def test_ratios_printed_in_chunks_read_as_one(self):
        whole = records.read_tables(fixture("stage09_steps4_quick.json")).of_kind("ratios")[0]
        split = [records.Table("ratios", whole.columns[:4] + whole.columns[i:j], dict(whole.meta),
                               [r[:4] + r[i:j] for r in whole.rows]) for i, j in ((4, 10), (10, len(whole.columns)))]
        one, _ = tables.read_ratios(self.run_file(records.Run({}, [whole]), "one.json"))
        two, _ = tables.read_ratios(self.run_file(records.Run({}, split), "two.json"))
        self.assertEqual(one, two)
        self.assertEqual(one[("bf16", 64, 4096, True)]["stage09_step5/sdpa_flash/backward"], [1.03, 0.99, 1.03])

    def test_other_kinds_are_passed_over(self):
        # A run's tables.json holds every kind it printed; the stage 09 readers take theirs only.
        extra = records.Table("worst", [records.Column("what", "what", 0, "s"), records.Column("value", "value", 0, ".2f")])
        extra.add("stage 07 / sdpa_flash", 1.08)
        run = records.read_tables(fixture("stage09_steps4_quick.json"))
        run.tables.append(extra)
        path = self.run_file(run)
        self.assertEqual(tables.read_stage09_steps(path)["rows"],
                         tables.read_stage09_steps(fixture("stage09_steps4_quick.json"))["rows"])

    def test_missing_and_wrong_files(self):
        missing = os.path.join(self.tmp, "none.json")
        self.assertIsNone(tables.read_stage09_steps(missing))
        self.assertEqual(tables.read_ratios(missing), ({}, {}))
        self.assertEqual(tables.read_stage09_pairs([missing]), ({}, [], []))
        wrong = os.path.join(self.tmp, "wrong.json")
        with open(wrong, "w", encoding="utf-8") as f:
            json.dump({"format": "something else"}, f)
        self.assertRaises(ValueError, tables.read_stage09_steps, wrong)
        self.assertIsNone(tables.read_stage09_steps(self.run_file(records.Run({}, []))))  # no row

    def test_road_table(self):
        road = tables.read_stage09_steps(fixture("stage09_steps4_quick.json"))
        lines = stage09.road_table(road, os.path.join(self.tmp, "t.txt"), name="docs/results/stage09_steps4_quick.txt")
        self.assertEqual(lines[1], f"{H100}, 2026-11-25; B*N = 16384, H*d = 2048; from docs/results/stage09_steps4_quick.txt")
        self.assertEqual(lines[4].split(), ["step", "2", "242.1", "(0.90)", "222.8", "(0.99)"])
        self.assertEqual(lines[5].split(), ["step", "4", "264.5", "(0.98)", "x1.09", "242.4", "(1.08)", "x1.09"])
        self.assertEqual(lines[6].split(), ["step", "5", "250.4", "(0.93)", "x0.95", "229.5", "(1.02)", "x0.95"])
        self.assertIn("  slower: step 5 x0.95 at d=64: every column", lines)
        self.assertEqual(stage09.road_table(None, os.path.join(self.tmp, "t.txt"), name="X", how="Y"),
                         ["stage 09's road: not measured yet (needs X: Y)"])


def lesson_files():
    """The site's lesson files (tables and lesson_numbers.doxy) made from docs/results/, as
    make_results.py --lesson-tables makes them: {file name: text}."""
    results = os.path.join(REPO, "docs", "results")
    args = argparse.Namespace(gpu_csv=os.path.join(results, "gpu_sweep.csv"), cpu_jsonl=os.path.join(results, "cpu_sweep.jsonl"),
                              road_csv=None, road11_csv=None, stage09_steps=None)
    with tempfile.TemporaryDirectory(prefix="lesson_files_") as folder:
        site.write_lesson_files(site.read_records(args), folder)
        out = {}
        for name in os.listdir(folder):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                out[name] = f.read()
        return out


def lesson_texts():
    """{path: text} of every page that may quote an alias or include a table: the lessons, their
    record pages, the docs' own pages and the README."""
    paths = (glob.glob(os.path.join(REPO, "stages", "*", "README.md")) + glob.glob(os.path.join(REPO, "stages", "*", "RECORD.md"))
             + glob.glob(os.path.join(REPO, "docs", "*.md")) + [os.path.join(REPO, "README.md")])
    texts = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            texts[os.path.relpath(path, REPO)] = f.read()
    return texts


class LessonsComplete(unittest.TestCase):
    """What the lessons quote and include from docs/results/ is all there and measured."""

    @classmethod
    def setUpClass(cls):
        cls.files = lesson_files()
        cls.texts = lesson_texts()
        cls.aliases = dict(re.findall(r'^ALIASES \+= "([^=]+)=(.*)"$', cls.files["lesson_numbers.doxy"], re.M))

    def test_every_alias_a_lesson_uses_is_defined_and_measured(self):
        used = {}
        for path, text in self.texts.items():
            for name in re.findall(r"\\((?:s\d\d|ceiling)_[A-Za-z0-9_]+)", text):
                used.setdefault(name, path)
        self.assertGreater(len(used), 100)  # the lessons of stages 07, 09, 10 and 11 quote hundreds
        missing = sorted(f"\\{name} ({path})" for name, path in used.items() if name not in self.aliases)
        self.assertEqual(missing, [], "aliases the lessons use that lesson_numbers.doxy lacks")
        empty = sorted(f"\\{name} ({path})" for name, path in used.items() if self.aliases.get(name) == "–")
        self.assertEqual(empty, [], "aliases the lessons use that read '–' (their record is missing)")

    def test_every_table_a_lesson_includes_is_written_and_measured(self):
        included = {name for text in self.texts.values() for name in re.findall(r"\\verbinclude\s+(\S+)", text)}
        written = set(self.files) - {"lesson_numbers.doxy"}
        self.assertEqual(written - included, set(), "tables written that no page includes")
        for name in sorted(included & written):
            text = self.files[name]
            self.assertNotIn("not measured yet", text.splitlines()[0] + text.splitlines()[-1], name)
            self.assertNotIn("no record of", text, name)


class WholePage(TempDir):
    def test_the_page_from_docs_results_without_plots(self):
        # Every section's code runs on the real records; the plots are left out (no matplotlib needed).
        results = os.path.join(REPO, "docs", "results")
        args = argparse.Namespace(gpu_csv=os.path.join(results, "gpu_sweep.csv"),
                                  cpu_jsonl=os.path.join(results, "cpu_sweep.jsonl"), out=os.path.join(self.tmp, "results.md"),
                                  images=os.path.join(self.tmp, "images"), lesson_pages="stage07,stage09,stage10",
                                  road_csv=None, road11_csv=None, stage09_steps=None, lesson_tables=None)
        with unittest.mock.patch.object(plots, "HAVE_MPL", False):
            site.write_site(args)
        with open(args.out, encoding="utf-8") as f:
            page = f.read()
        for anchor in ("results_gpu", "results_stage07", "results_stage07_road", "results_stage09", "results_stage09_road",
                       "results_stage10", "results_stage10_varlen", "results_stage11", "results_stage11_road",
                       "results_stage11_first_contact", "results_cpu", "results_newcomer", "results_sources"):
            self.assertIn(f"{{#{anchor}}}", page)
        self.assertIn("this build has tables only", page)
        self.assertNotIn("\\warning", page)  # no record of docs/results/ has a malformed line
        self.assertEqual(os.listdir(args.images), [])


if __name__ == "__main__":
    unittest.main()
