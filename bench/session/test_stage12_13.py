"""Tests of stage 12's and 13's experiments without a GPU: sweep12's finish joins our records and
SDPA's round by round into the CSV and the table of medians; the sanitizer cases of both stages
name options their executables take; serve13 passes its parameters as stage13_decode's options and
sums up its records.

    python3 -m unittest discover -s bench/session -p 'test_*.py'     (from the repository root; CTest runs it)
"""
import csv
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # bench/: the package `session`

from session import runner, sanitize, stage12, stage13  # noqa: E402
from session.experiment import Where, resolve_params  # noqa: E402


class Sweep12Finish(unittest.TestCase):
    def test_rounds_and_ratios(self):
        p = {"steps": ("0", "1"), "dtypes": ("bf16",), "head_dims": (128,), "sizes": (4096,), "tokens": 16384,
             "width": 2048, "repeat": 20, "rounds": 2, "sdpa": True}
        points = stage12.sweep12_points(p)
        self.assertEqual([(q["batch"], q["heads"], q["causal"]) for q in points], [(4, 16, False), (4, 16, True)])
        with tempfile.TemporaryDirectory() as tmp:
            where = Where(results=tmp, log=os.path.join(tmp, "log"), params=p)
            for point in points:
                for step, ms in (("0", 2.0), ("1", 1.0)):
                    name = stage12._record_name(step, "bf16", 128, 4096, point["causal"])
                    with open(os.path.join(tmp, name), "w") as f:  # round 0, then round 1 a tenth slower
                        for scale in (1.0, 1.1):
                            f.write(json.dumps({"median_ms": ms * scale, "pass": True, "date": "2026-12-07"}) + "\n")
            with open(os.path.join(tmp, "stage12_sdpa.jsonl"), "w") as f:
                for rnd in range(2):
                    for point in points:
                        f.write(json.dumps(dict(point, round=rnd, backend="flash", ms=3.0, gpu="GPU X")) + "\n")
                        f.write(json.dumps(dict(point, round=rnd, backend="cudnn", ms=1.5, gpu="GPU X")) + "\n")
            stage12._sweep12_finish(p, None, where)
            with open(os.path.join(tmp, "stage12_sweep.csv")) as f:
                rows = list(csv.DictReader(f))
            self.assertEqual(len(rows), 4)
            first = rows[0]
            self.assertEqual((first["round"], first["causal"]), ("0", "False"))
            self.assertAlmostEqual(float(first["step1_over_cudnn"]), 1.5)
            self.assertAlmostEqual(float(first["step0_over_flash"]), 1.5)
            flops = 4.0 * 4 * 16 * 4096 ** 2 * 128 * 2.5
            self.assertAlmostEqual(float(first["step1_tflops"]), flops / 1.0 * 1e-9)
            self.assertAlmostEqual(float(rows[1]["step1_over_cudnn"]), 1.5 / 1.1)
            self.assertAlmostEqual(float(rows[2]["step1_tflops"]), flops / 2 * 1e-9)  # causal: half the work
            with open(os.path.join(tmp, "stage12_sweep_table.txt")) as f:
                table = f.read().splitlines()
            self.assertEqual(len(table), 5)  # the title, a blank line, the header and one line per point
            self.assertTrue(table[0].startswith("GPU X, 2026-12-07: the backward alone"))
            self.assertIn("(1.36-1.50)", table[3])


class SanitizeSummary(unittest.TestCase):
    def test_the_stage_banner_is_part_of_its_run(self):
        log = "\n".join([
            "stage 12: road steps 1 (of 1 to 1, from stage12_hopper_backward --help)",
            "== memcheck stage12_hopper_backward --seq-q 130 --step 1",
            "========= COMPUTE-SANITIZER",
            "== flashcourse stage 12: Hopper backward ==",
            "verdict    PASS: 3 comparisons within tolerance",
            "========= ERROR SUMMARY: 0 errors",
            "== memcheck stage12_hopper_backward --seq-q 77 --step 1",
            "== flashcourse stage 12: Hopper backward ==",
            "skipped: stage 12 needs a Hopper GPU",
        ]) + "\n"
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "sanitize_stage12_memcheck.log"), "w") as f:
                f.write(log)
            lines = sanitize.summary(Where(results=tmp, log=os.path.join(tmp, "log"), params={}))
        self.assertEqual(lines, [
            "no summary  memcheck stage12_hopper_backward --seq-q 77 --step 1: skipped: stage 12 needs a Hopper GPU",
            "-- sanitize_stage12_memcheck.log",
            "      1 ========= ERROR SUMMARY: 0 errors",
        ])


class SanitizeCases(unittest.TestCase):
    def test_cases_use_known_options(self):
        import re
        root = os.path.dirname(os.path.dirname(HERE))
        for stage, cases, main in (("12", sanitize.CASES12, "stages/12_hopper_backward/main.cpp"),
                                   ("13", sanitize.CASES13, "stages/13_decode/main.cpp")):
            with open(os.path.join(root, main)) as f:
                source = f.read()
            with open(os.path.join(root, "common/src/stage.cpp")) as f:
                source += f.read()
            with open(os.path.join(root, "common/src/cli.cpp")) as f:
                source += f.read()
            for case in cases:
                for option in re.findall(r"--[a-z-]+", case):
                    self.assertIn(f'"{option}"', source, f"stage {stage}: {option} in '{case}'")


class Serve13(unittest.TestCase):
    def commands(self, **sets):
        exp = stage13.SERVE13
        params = resolve_params(exp, {k: str(v) for k, v in sets.items()})
        ctx = runner.Context("/w", "/b", "/nonexistent/out", dry_run=True)
        return exp.commands(params, ctx)

    def test_parameters_become_options(self):
        cmds = self.commands()
        self.assertEqual(len(cmds), 3)  # one per round, the reports appended to one file
        argv = [str(a) for a in cmds[0].argv]
        self.assertEqual(argv[:2], ["/b/stages/13_decode/stage13_decode", "--serve"])
        words = " ".join(argv)
        for option in ("--requests 256", "--max-batch 64", "--prompt-min 128", "--prompt-max 4096", "--decode-steps 128",
                       "--page-size 64", "--heads 32", "--kv-heads 8", "--head-dim 128", "--dtype bf16",
                       "--json /w/results/serve13/stage13_serve.jsonl"):
            self.assertIn(option, words)
        self.assertNotIn("--pool-pages", words)  # 0: the executable derives the pool
        self.assertTrue(all(c.append and c.stdout == "/w/results/serve13/stage13_serve.txt" for c in cmds))
        self.assertIn("--pool-pages 900", " ".join(str(a) for a in self.commands(pool_pages=900)[0].argv))
        with open(os.path.join(os.path.dirname(os.path.dirname(HERE)), "stages/13_decode/main.cpp")) as f:
            source = f.read()
        with open(os.path.join(os.path.dirname(os.path.dirname(HERE)), "common/src/cli.cpp")) as f:
            source += f.read()
        for option in (a for a in argv if a.startswith("--")):
            self.assertIn(f'"{option}"', source, option)

    def test_bad_values_are_refused(self):
        for name, value in (("dtype", "fp8"), ("prefill", "stage05"), ("prompt_dist", "zipf"), ("heads", "32")):
            with self.subTest(name), self.assertRaises(ValueError):
                self.commands(**{name: value})

    def test_summary(self):
        record = {"tokens_per_s": 12345.6, "decode_tokens": 32768, "wall_s": 2.65, "step_ms_median": 0.1234,
                  "prefill_attention_ms": 45.6, "paged_bytes": 0.5 * 2**30, "contiguous_bytes": 1.0 * 2**30,
                  "paged_over_contiguous": 0.5, "pass": True, "gpu": "GPU X"}
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "stage13_serve.jsonl"), "w") as f:
                for rate in (3.0, 1.0, 2.0):
                    f.write(json.dumps(dict(record, tokens_per_s=rate * 1000)) + "\n")
            lines = stage13._serve13_summary(Where(results=tmp, log=os.path.join(tmp, "log"), params={}))
        self.assertEqual(len(lines), 4)
        self.assertTrue(lines[0].startswith("round 0: 3000 tokens/s (32768 tokens, 2.65 s), step 0.1234 ms median"))
        self.assertIn("pages 0.50 GiB against 1.00 GiB contiguous (0.50), PASS", lines[0])
        self.assertEqual(lines[3], "median 2000 tokens/s over 3 rounds (min 1000, max 3000); GPU X")


if __name__ == "__main__":
    unittest.main()
