#!/usr/bin/env python3
"""Checks, without a GPU, of every reader of Nsight Compute's CSV pages and of the tables drawn from
them: bench/ncu_pages.py (the raw page with its units row or without, thousands separators, text
values, a details page printed as CSV), ncu_side_by_side.py, ncu_steps11.py, ncu_source_diff.py and
ncu_source_lines.py (the source page), and docs/results_pages/ncu_csv.py (the long-form records of
docs/results/ and the raw pages). The fixtures in bench/testdata/ncu/ are laid out as `ncu --import
R --csv --page raw` (and --page source) print them.

    python3 -m unittest discover -s bench -p 'test_ncu*.py'     (CTest runs it as ncu_csv)
"""
import contextlib
import csv
import importlib.util
import io
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
DATA = os.path.join(HERE, "testdata", "ncu")

import ncu_pages  # noqa: E402
import ncu_side_by_side  # noqa: E402
import ncu_source_diff  # noqa: E402
import ncu_source_lines  # noqa: E402
import ncu_steps11  # noqa: E402


def fixture(name):
    return os.path.join(DATA, name)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def printed(fn, *args):
    """What fn(*args) prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn(*args)
    return out.getvalue()


def docs_reader():
    """docs/results_pages/ncu_csv.py as a module of its own (its package is the docs build's)."""
    path = os.path.join(HERE, "..", "docs", "results_pages", "ncu_csv.py")
    spec = importlib.util.spec_from_file_location("ncu_csv", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class RawPage(unittest.TestCase):
    def test_units_row_separators_and_text(self):
        launches = ncu_pages.read_launches(fixture("raw_units.csv"))
        self.assertEqual(len(launches), 3, "the units row is not a launch")
        first = launches[0]
        self.assertIn("StepN<(int)9>", first.kernel)
        self.assertEqual(first.info["Grid Size"], "(132, 1, 1)")
        self.assertEqual(first.signature()[-23:], "(132, 1, 1)x(384, 1, 1)")
        self.assertEqual(first.metrics["gpu__time_duration.sum"], (834016.0, "nsecond"))
        self.assertEqual(first.value("smsp__inst_executed.sum"), 81730528.0)  # "81,730,528"
        self.assertEqual(first.metrics["smsp__pcsamp_sample_count"], ("n/a", ""))
        self.assertIsNone(first.value("smsp__pcsamp_sample_count"))
        self.assertEqual(first.metrics["device__attribute_display_name"][0], "NVIDIA H100 80GB HBM3")
        self.assertAlmostEqual(first.in_unit("gpu__time_duration.sum", "us"), 834.016)
        self.assertAlmostEqual(launches[2].in_unit("l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum", "MB"), 1300.0)
        self.assertAlmostEqual(first.in_unit("dram__bytes_read.sum", "MB"), 418.44)
        self.assertIsNone(first.in_unit("no__such.sum", "MB"))

    def test_counters_leave_out_what_every_launch_carries(self):
        counters = ncu_pages.first_launch(fixture("raw_units.csv")).counters()
        self.assertIn("launch__registers_per_thread", counters)
        self.assertFalse(any(n.startswith(("device__", "profiler__")) for n in counters))
        self.assertNotIn("smsp__pcsamp_sample_count", counters, "a text value is not a counter")

    def test_no_units_row_and_lines_between(self):
        launches = ncu_pages.read_launches(fixture("raw_no_units.csv"))
        self.assertEqual([ln.value("launch__registers_per_thread") for ln in launches], [32.0, 254.0])
        self.assertEqual(launches[1].metrics["gpu__time_duration.sum"], (6170000.0, ""))
        self.assertAlmostEqual(launches[1].in_unit("gpu__time_duration.sum", "us"), 6170.0, msg="no unit: base unit")
        self.assertEqual(launches[0].metrics["launch__func_cache_config"][0], "CachePreferNone")

    def test_details_page_as_csv(self):
        launches = ncu_pages.read_launches(fixture("details_listing.csv"))
        self.assertEqual([ln.kernel for ln in launches], ["fill_kernel", "attention_fprop", "fill_kernel"])
        self.assertAlmostEqual(launches[1].in_unit("gpu__time_duration.sum", "us"), 227.81)
        self.assertAlmostEqual(launches[0].in_unit("gpu__time_duration.sum", "us"), 81.856)

    def test_missing_and_empty(self):
        self.assertIsNone(ncu_pages.first_launch(fixture("nonexistent.csv")))
        with tempfile.TemporaryDirectory() as tmp:
            empty = os.path.join(tmp, "e.csv")
            open(empty, "w").close()
            self.assertEqual(ncu_pages.read_launches(empty), [])
        self.assertEqual(ncu_pages.number(" 1,024 "), 1024.0)
        self.assertIsNone(ncu_pages.number("(!) n/a"))
        self.assertIsNone(ncu_pages.number("12; 12; 12"))


class SideBySide(unittest.TestCase):
    def test_units_first_launch_and_csv(self):
        values = ncu_side_by_side.read(fixture("raw_units.csv"))
        self.assertAlmostEqual(values["gpu__time_duration.sum"][0], 834.016)  # the first launch's, in us
        self.assertEqual(values["gpu__time_duration.sum"][1], "us")
        self.assertEqual(values["dram__bytes_read.sum"][1], "MB")
        self.assertEqual(values["smsp__inst_executed.sum"], (81730528.0, "inst"))
        self.assertNotIn("device__attribute_multiprocessor_count", values)
        with tempfile.TemporaryDirectory() as tmp:
            table = os.path.join(tmp, "t.csv")
            lines = printed(ncu_side_by_side.main, ["--csv", table, f"ours={fixture('raw_units.csv')}",
                                                    f"theirs={fixture('raw_no_units.csv')}"]).splitlines()
            self.assertEqual(lines[0].split(), ["counter", "unit", "ours", "theirs"])
            time = next(line for line in lines if line.startswith("gpu__time_duration.sum"))
            self.assertEqual(time.split()[-2:], ["834.02", "91,200.00"])  # a page without units: as it gives it
            regs = next(line for line in lines if line.startswith("l1tex__t_requests"))
            self.assertEqual(regs.split()[-1], "-")  # the second report lacks it
            rows = read_csv(table)
            self.assertEqual(rows[0], ["counter", "unit", "ours", "theirs"])
            by_name = {r[0]: r for r in rows[1:]}
            self.assertEqual(by_name["gpu__time_duration.sum"][1], "us")
            self.assertAlmostEqual(float(by_name["gpu__time_duration.sum"][2]), 834.016)
            self.assertEqual(by_name["l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"][3], "")
        with self.assertRaises(SystemExit):
            ncu_side_by_side.main(["no-label"])

    def test_longest_kernel(self):
        self.assertEqual(ncu_side_by_side.longest(fixture("details_listing.csv")), "attention_fprop")
        self.assertEqual(ncu_side_by_side.longest(fixture("raw_no_units.csv")).split("<")[0], "void flash_backward_kernel")
        self.assertEqual(printed(ncu_side_by_side.main, ["--longest", fixture("details_listing.csv")]).strip(),
                         "attention_fprop")
        with tempfile.TemporaryDirectory() as tmp:
            empty = os.path.join(tmp, "e.csv")
            with open(empty, "w") as f:
                f.write("==PROF== no kernels\n")
            self.assertEqual(ncu_side_by_side.longest(empty), "")


class Steps11(unittest.TestCase):
    def test_first_launch_of_each_step_names_and_csv(self):
        runs = {}
        ncu_steps11.read(fixture("raw_units.csv"), runs)
        self.assertEqual(sorted(runs), [(128, 9, False), (128, 10, False)])
        self.assertAlmostEqual(runs[(128, 9, False)]["gpu__time_duration.sum"], 834.016)  # the first launch's, in us
        self.assertEqual(runs[(128, 10, False)]["l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"], 262144.0)
        with tempfile.TemporaryDirectory() as tmp:
            table = os.path.join(tmp, "steps.csv")
            out = printed(ncu_steps11.main, ["--csv", table, "--names", fixture("bench_gpu_steps.csv"),
                                             fixture("raw_units.csv")])
            rows = [line.split() for line in out.splitlines()[2:]]
            self.assertEqual([r[:3] for r in rows], [["128", "9", "persistent"], ["128", "10", "wide"]])
            self.assertEqual(rows[0][3:5], ["834.0", "74.9"])
            self.assertIn("1.86", rows[0])
            self.assertEqual(rows[0][-1], "-")  # a stall the report lacks
            data = read_csv(table)
            self.assertEqual(data[0][:5], ["d", "step", "name", "instrumented", "us"])
            self.assertEqual(data[0][-1], "stall_not_selected")
            self.assertEqual(data[2][:4], ["128", "10", "wide stores", "0"])
            self.assertAlmostEqual(float(data[1][4]), 834.016)
            self.assertEqual(data[1][data[0].index("stall_wait")], "1.86")
        with self.assertRaises(SystemExit):
            ncu_steps11.main([fixture("raw_no_units.csv")])  # no hopper_forward_kernel launch


class SourcePages(unittest.TestCase):
    def test_sums_by_opcode_and_csv(self):
        inst, samples = ncu_source_diff.read(fixture("source_sass.csv"))
        self.assertEqual(inst["BRA"], 1000)  # "1,000" read as a number, predicates dropped
        self.assertEqual(samples["BRA"], 16)
        self.assertEqual((inst["REDG"], inst["UIADD3"], inst["LDC"]), (2000, 400, 100))
        with tempfile.TemporaryDirectory() as tmp:
            base = os.path.join(tmp, "base.csv")
            with open(fixture("source_sass.csv")) as f, open(base, "w") as g:
                g.write(f.read().replace('"1,000"', '"10"'))
            table = os.path.join(tmp, "diff.csv")
            lines = printed(ncu_source_diff.main, ["--csv", table, f"packed={fixture('source_sass.csv')}",
                                                   f"dense={base}"]).splitlines()
            self.assertIn("packed 3,500 against dense 2,510 (1.394x)", lines[0])
            self.assertEqual(lines[2].split(), ["BRA", "1,000", "10", "+990"])
            rows = read_csv(table)
            self.assertEqual(rows[0], ["measure", "opcode", "packed", "dense", "difference"])
            self.assertEqual(rows[1], ["instructions", "all", "3500", "2510", "990"])
            self.assertEqual(rows[2], ["instructions", "BRA", "1000", "10", "990"])
            self.assertIn(["samples", "all", "26", "26", "0"], rows)
        with self.assertRaises(SystemExit):
            ncu_source_diff.main(["no-label"])

    def test_lines_snippets_and_csv(self):
        entries = ncu_source_lines.read(fixture("source_cuda_sass.csv"))
        by_line = {(os.path.basename(e[0]), e[1]): e for e in entries}
        self.assertEqual(by_line[("kernel.cuh", "2")][3:], [40.0, 2000.0])  # its two instructions' sums
        self.assertEqual(by_line[("kernel.cuh", "4")][3:], [5.0, 500.0])
        self.assertEqual(by_line[("ptx.cuh", "7")][3], 30.0)
        with tempfile.TemporaryDirectory() as tmp:
            source = os.path.join(tmp, "kernel.cuh")
            with open(source, "w") as f:
                f.write("//! [softmax]\n    x = ex2(x);\n//! [softmax]\n    row_sum += x;\n")
            table = os.path.join(tmp, "lines.csv")
            out = printed(ncu_source_lines.main, [f"k={fixture('source_cuda_sass.csv')},{fixture('source_sass.csv')}",
                                                  "--top", "2", "--snippets", source, "--csv", table])
            self.assertIn("== k: 75 warp samples", out)
            self.assertIn("the SASS page: 26 samples", out)
            rows = read_csv(table)
            self.assertEqual(rows[0], ncu_source_lines.CSV_HEADER)
            kinds = [r[1] for r in rows[1:]]
            self.assertEqual(kinds, ["total", "sass_total", "snippet_total", "snippet", "line", "line"])
            self.assertEqual(rows[4][2:7], ["softmax", "kernel.cuh", "1", "3", "40"])
            self.assertEqual(rows[4][8], "88.9")  # 40 of the 45 samples on kernel.cuh's lines
            self.assertEqual(rows[5][3:8], ["kernel.cuh", "2", "", "40", "2000"])
            self.assertEqual(rows[5][9], "x = ex2(x);")


class DocsReader(unittest.TestCase):
    """docs/results_pages/ncu_csv.py, which the pages read Nsight Compute's records with."""

    def setUp(self):
        self.r = docs_reader()

    def test_parts_first_occurrence_and_text_left_out(self):
        parts = self.r.read_ncu_parts(fixture("long_form.csv"))
        self.assertEqual(list(parts), ["d=64: sections", "d=64: counters"])
        sections = parts["d=64: sections"]
        self.assertEqual(sections["Duration"], (2.58, "ms"))
        self.assertEqual(sections["Theoretical Occupancy"], (12.5, "%"))  # the first of the two
        self.assertEqual(sections["Waves Per SM"], (15.52, ""))
        self.assertNotIn("Cluster Scheduling Policy", sections)
        self.assertEqual(parts["d=64: counters"]["l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum"], (1.3, "Gbyte"))
        self.assertEqual(self.r.read_ncu_parts(fixture("nonexistent.csv")), {})
        with self.assertRaises(ValueError):
            self.r.read_ncu_parts(fixture("raw_units.csv"))

    def test_metrics_of_both_forms_first_wins(self):
        merged = self.r.read_ncu_metrics(DATA, "long_form.csv", "raw_units.csv", "nonexistent.csv")
        self.assertEqual(merged["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"], (919784617.0, ""))
        self.assertEqual(merged["gpu__time_duration.sum"], (2.61, "ms"))  # the long-form file came first
        self.assertEqual(merged["launch__registers_per_thread"], (168.0, "register/thread"))
        self.assertNotIn("smsp__pcsamp_sample_count", merged, "a text value is left out")
        raw = self.r.read_ncu_metrics(DATA, "raw_units.csv")
        self.assertEqual(raw["gpu__time_duration.sum"], (834016.0, "nsecond"))  # the first launch wins

    def test_launches(self):
        launches = self.r.read_ncu_launches(fixture("raw_units.csv"))
        self.assertEqual(len(launches), 3)
        self.assertEqual(launches[2]["gpu__time_duration.sum"], (810400.0, "nsecond"))
        self.assertIn("StepN<(int)10>", launches[2]["Kernel Name"][0])
        self.assertEqual(launches[0]["smsp__pcsamp_sample_count"], ("n/a", ""))
        self.assertEqual(self.r.read_ncu_launches(fixture("nonexistent.csv")), [])


if __name__ == "__main__":
    unittest.main()
