#!/usr/bin/env python3
"""Checks of sdpa_compare.py that need neither a GPU nor torch: its doctests, and stage 10's
comparisons and tables on synthetic rows of three rounds as bench_gpu and the SDPA side write them
(grouped heads beside three backends, a window beside the plain causal kernels, dropout whose
backward stage 09 refuses, the packed batch beside the uniform one and SDPA's nested and padded
batches). Run: python3 bench/test_sdpa_compare.py"""
import contextlib
import csv
import doctest
import io
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sdpa_compare as sc  # noqa: E402

REFUSED = "refused: --dropout 0.1: stage 09 does not apply dropout yet"


def row(impl, ms, pass_="forward", n=16384, d=64, dtype="bf16", flops=1e12, **extra):
    """A timed row (tflops from `flops` FLOPs in `ms`), or a refused one when ms is None."""
    r = dict(impl=impl, dtype=dtype, B=1 if n == 16384 else 4, H=2048 // d, N=n, d=d, causal=1, gpu="Test GPU", date="2026-11-25",
             median_ms=ms, min_ms=ms, max_ms=ms, tflops=None if ms is None else flops / (ms * 1e-3) * 1e-12, **{"pass": pass_})
    r.update(extra)
    return r


def one_round(k):
    """The rows of round k (0, 1, 2): SDPA a little slower each round, the rest alike."""
    rows = []
    for pass_, scale in (("forward", 1.0), ("backward", 2.5), ("fwd+bwd", 3.5)):
        rows += [row("stage10_causal", 2.0 * scale, pass_), row("stage10_window4095", 0.6 * scale, pass_, spec="1/4095/0"),
                 row("stage10_gqa8", 2.0 * scale, pass_, spec="8/-1/0")]
        for name, slower in (("flash", 1.1), ("cudnn", 0.8)):
            rows.append(row(f"sdpa_{name}_gqa8", 2.0 * scale * (slower + 0.01 * k), pass_, spec="8/-1/0"))
        rows.append(row("sdpa_efficient_gqa8", None, pass_, note="unsupported: No available kernel"))
        rows.append(row("stage10_dropout0.1", 2.8 if pass_ == "forward" else None, pass_, spec="1/-1/0/0/0.1",
                        **({} if pass_ == "forward" else dict(note=REFUSED))))
        rows.append(row("sdpa_flash_dropout0.1", 3.0 * scale, pass_, spec="1/-1/0/0/0.1"))
        rows += [row("stage10_varlen", 1.2 * scale, pass_), row("stage10_varlen_uniform", 0.78 * scale, pass_, flops=0.66e12),
                 row("stage10_dense_uniform", 0.74 * scale, pass_, flops=0.66e12),
                 row("sdpa_flash_varlen", 1.3 * scale, pass_),
                 row("sdpa_efficient_padded", 2.0 * scale, pass_, padded_bytes=3 << 20, packed_bytes=2 << 20),
                 row("sdpa_flash_padded", None, pass_, note="unsupported: flash has no attn_mask")]
    return rows


class Stage10Tables(unittest.TestCase):
    def setUp(self):
        self.rounds = [one_round(k) for k in range(3)]
        self.rows = sc.median_rows(self.rounds)
        self.comparisons = sc.stage10_comparisons(self.rows, self.rounds)
        self.by = {(c["kind"], c["ours"], c["other"], c["pass"]): c for c in self.comparisons}

    def test_ratios_over_rounds(self):
        c = self.by[("vs_sdpa", "stage10_gqa8", "sdpa_flash_gqa8", "fwd+bwd")]
        self.assertEqual(c["rounds"], 3)
        self.assertAlmostEqual(c["value"], 1.11)  # the middle round's SDPA over ours, by rate
        self.assertAlmostEqual(c["lo"], 1.10)
        self.assertAlmostEqual(c["hi"], 1.12)
        self.assertAlmostEqual(self.by[("vs_sdpa", "stage10_gqa8", "sdpa_cudnn_gqa8", "forward")]["value"], 0.81)

    def test_window_against_causal_time(self):
        c = self.by[("vs_causal", "stage10_window4095", "stage10_causal", "forward")]
        self.assertAlmostEqual(c["value"], 0.3)
        self.assertAlmostEqual(self.by[("vs_causal", "stage10_window4095", "stage10_causal", "fwd+bwd")]["value"], 0.3)

    def test_refused_sides_keep_their_reason(self):
        ours = self.by[("vs_sdpa", "stage10_dropout0.1", "sdpa_flash_dropout0.1", "fwd+bwd")]
        self.assertEqual(ours["value"], "")
        self.assertEqual(ours["note"], REFUSED)
        self.assertAlmostEqual(self.by[("vs_sdpa", "stage10_dropout0.1", "sdpa_flash_dropout0.1", "forward")]["value"], 3.0 / 2.8)
        sdpa = self.by[("vs_sdpa", "stage10_gqa8", "sdpa_efficient_gqa8", "forward")]
        self.assertEqual((sdpa["value"], sdpa["note"]), ("", "unsupported: No available kernel"))

    def test_packed_batch(self):
        dense = self.by[("vs_dense", "stage10_varlen", "stage10_dense_uniform", "forward")]
        self.assertAlmostEqual(dense["value"], (1.0 / 1.2) / (0.66 / 0.74))
        self.assertAlmostEqual(self.by[("vs_sdpa", "stage10_varlen", "sdpa_flash_varlen", "backward")]["value"], 1.3 / 1.2)
        self.assertAlmostEqual(self.by[("vs_sdpa", "stage10_varlen", "sdpa_efficient_padded", "forward")]["value"], 2.0 / 1.2)
        self.assertAlmostEqual(self.by[("memory", "stage10_varlen", "sdpa_efficient_padded", "forward")]["value"], 1.5)

    def test_tables_and_csv(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            sc.print_stage10_tables(self.comparisons, self.rows, "Test GPU", "2026-11-25")
        text = out.getvalue()
        lines = text.splitlines()
        gqa = next(x for x in lines if x.split()[:4] == ["gqa8", "bf16", "64", "16384"])
        self.assertIn("1.11 [1.10-1.12]", gqa)  # flash, forward: SDPA 1.10 to 1.12 times slower, 1.11 the median
        self.assertIn("unsupported", gqa)      # efficient refused
        window = next(x for x in lines if x.split()[:4] == ["window4095", "bf16", "64", "16384"])
        self.assertIn("0.30 [0.30-0.30]", window)
        self.assertTrue(window.endswith("met") and not window.endswith("not met"))
        self.assertIn("refused", next(x for x in lines if x.split()[:4] == ["dropout0.1", "bf16", "64", "16384"]))
        self.assertTrue(any("1.50x" in x for x in lines))  # the padded batch's memory over the packed one's
        self.assertIn(f"stage10_dropout0.1 backward, fwd+bwd: {REFUSED}", text)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "stage10.csv")
            sc.write_csv(path, self.comparisons, sc.STAGE10_COLUMNS)
            with open(path, newline="") as f:
                back = list(csv.DictReader(f))
        self.assertEqual(len(back), len(self.comparisons))
        self.assertEqual(list(back[0]), sc.STAGE10_COLUMNS)

    def test_no_stage10_rows(self):
        self.assertEqual(sc.stage10_comparisons([row("stage07", 1.0)], [[row("stage07", 1.0)]]), [])
        with contextlib.redirect_stdout(io.StringIO()):
            sc.print_stage10_tables([], [], "Test GPU", "2026-11-25")


def load_tests(loader, tests, ignore):
    tests.addTests(doctest.DocTestSuite(sc))
    return tests


if __name__ == "__main__":
    unittest.main()
