"""Tests of the PyTorch operator's experiment without a GPU or PyTorch: its parts run alone, the build is
timed from an empty build folder, and finish reads the training records back into torch_gpt.json.

    python3 -m unittest discover -s bench/session -p 'test_*.py'     (from the repository root; CTest runs it)
"""
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # bench/: the package `session`

from session import runner, torchop  # noqa: E402
from session.experiment import Where, resolve_params  # noqa: E402


def commands(**sets):
    ctx = runner.Context("/w", "/w/build", "/nonexistent/out", dry_run=True)
    params = resolve_params(torchop.TORCHOP, {k: str(v).lower() for k, v in sets.items()})
    return [c.argv for c in torchop.TORCHOP.commands(params, ctx)]


def write_run(folder, name, losses, speed):
    with open(os.path.join(folder, f"gpt_{name}.jsonl"), "w") as f:
        f.write(json.dumps({"kind": "settings", "attention": name}) + "\n")
        for i, loss in enumerate(losses):
            f.write(json.dumps({"kind": "step", "step": i, "loss": loss, "tokens": 100, "ms": 1.0}) + "\n")
        f.write(json.dumps({"kind": "summary", "tokens_per_s_median": speed, "final_loss": losses[-1]}) + "\n")


class Commands(unittest.TestCase):
    def test_build_from_an_empty_folder_then_tests_then_four_runs_and_a_plot(self):
        argvs = commands()
        rm = argvs.index(("rm", "-rf", "python/build"))
        build = next(i for i, a in enumerate(argvs) if "pip" in a)
        self.assertLess(rm, build)
        self.assertEqual(argvs[build][-len(torchop.BUILD_COMMAND):], torchop.BUILD_COMMAND)
        self.assertTrue(any(a[:3] == ("python3", "-m", "pytest") for a in argvs))
        runs = [a for a in argvs if "python/examples/train_gpt.py" in a]
        self.assertEqual(len(runs), 4)
        self.assertIn("--varlen", runs[3])
        self.assertIn("python/examples/plot_losses.py", argvs[-1])

    def test_each_part_alone(self):
        self.assertFalse(any("pip" in a for a in commands(build=False)))
        only_tests = commands(build=False, train=False)
        self.assertEqual(len(only_tests), 1)
        self.assertEqual(only_tests[0][:3], ("python3", "-m", "pytest"))
        with self.assertRaisesRegex(ValueError, "nothing would run"):
            commands(build=False, tests=False, train=False)


class Finish(unittest.TestCase):
    def test_gaps_speeds_and_the_verdict(self):
        with tempfile.TemporaryDirectory() as tmp:
            base = [3.0 - 0.01 * i for i in range(100)]
            write_run(tmp, "sdpa_seed0", base, 1000.0)
            write_run(tmp, "sdpa_seed1", [x + 0.05 for x in base], 1010.0)
            write_run(tmp, "flashcourse_seed0", [x + 0.01 for x in base], 1200.0)
            write_run(tmp, "flashcourse_varlen_seed0", [x + 0.01 for x in base], 1800.0)
            where = Where(tmp, os.path.join(tmp, "log"), dict(torchop.TORCHOP.params))
            torchop._torchop_finish(where.params, None, where)
            with open(os.path.join(tmp, "torch_gpt.json")) as f:
                r = json.load(f)
            self.assertAlmostEqual(r["gap_flashcourse_vs_sdpa_seed0"], 0.01)
            self.assertAlmostEqual(r["gap_sdpa_seed1_vs_seed0"], 0.05)
            self.assertTrue(r["curves_agree"])
            self.assertAlmostEqual(r["speed_flashcourse_over_sdpa"], 1.2)
            self.assertAlmostEqual(r["speed_varlen_over_padded"], 1.5)
            lines = torchop._torchop_summary(where)
            self.assertTrue(any("agree" in line for line in lines))

    def test_smoothing(self):
        self.assertEqual(torchop.smoothed([1.0, 3.0, 5.0], 2), [1.0, 2.0, 4.0])
        self.assertIsNone(torchop.curve_gap([], [1.0]))


if __name__ == "__main__":
    unittest.main()
