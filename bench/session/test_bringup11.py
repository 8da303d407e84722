"""Tests of bench/bringup11.py without a GPU: the record built from small `--json` records and a
ceiling's JSON lines, read back by docs/results_pages/readers.py; the readers of --help, of
cuobjdump's SASS and of its resource usage; the order of the parts on a fake machine (a step that
hangs is left out of the timing and the tests, the budget cuts limits and skips what is past it);
the experiment's record and dry run.

    python3 -m unittest discover -s bench/session -p 'test_*.py'     (from the repository root; CTest runs it)
"""
import io
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.dirname(HERE), os.path.join(ROOT, "docs")]  # bench/ (bringup11, session), docs/

import bringup11  # noqa: E402
from results_pages import readers  # noqa: E402
from session import registry  # noqa: E402
from session.experiment import Where  # noqa: E402
from session.test_session import dry  # noqa: E402

H100 = "NVIDIA H100 80GB HBM3"

# What `stage11_hopper_kernel --bench --json` appends (common/src/stage.cpp append_run_record), one
# non-causal run at d 64 and one causal at d 128.
RUN_D64 = {"stage": "11", "title": "Hopper kernel", "B": 1, "H": 16, "Nq": 4096, "Nk": 4096, "d": 64, "causal": False,
           "layout": "bhnd", "first_ms": 120.5, "median_ms": 0.2, "gflops": 343597.38, "peak_rss_bytes": 1,
           "rss_before_bytes": 1, "intermediate_bytes": 1.0, "pass": True, "machine": "a CPU", "date": "2026-11-29"}
RUN_D128 = dict(RUN_D64, d=128, causal=True, median_ms=0.25, gflops=274877.91)
# What `wgmma_ceiling --json` writes (bench/wgmma_ceiling.cu), two of its four lines.
CEILINGS = [{"name": "wgmma_ss_bf16", "instruction": "wgmma ... bf16", "value": 887.4, "unit": "TFLOP/s", "gpu": H100,
             "date": "2026-11-29"},
            {"name": "wgmma_rs_fp16", "instruction": "wgmma ... f16", "value": 898.9, "unit": "TFLOP/s", "gpu": H100,
             "date": "2026-11-29"}]

# CLI11's --help of stage11_hopper_kernel: a multi-line description goes on under the option's column.
HELP = """\
Options:
  -h,--help                   Print this help message and exit
  --dtype TEXT:{bf16,fp16}=bf16
                              16-bit type of the inputs and of O
  --step INT:INT in [0 - 3]   which step of the road runs (default: the final kernel):
                              0 stage 07: the point of departure: stage 07's final kernel
                              1 wgmma: one consumer warpgroup of 64 query rows
                              2 TMA ring: K and V tiles loaded by the TMA
                              3 producer warpgroup: warp specialization: a producer warpgroup
  --timeline TEXT             with --bench, bf16: also time the step's instrumented build
"""

SASS = """\
        Function : _ZN2fa7stage1121hopper_forward_kernelI13__nv_bfloat16Li64ENS0_5StepNILi1EEEEvNS0_4ArgsIT_EE
        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;
        /*0020*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*0030*/                   UTMALDG.2D [UR8], [UR4] ;
        Function : _ZN2fa7stage0720flash_forward_kernelI13__nv_bfloat16Li64EEEvNS0_4ArgsIT_EE
        /*0010*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
"""

RES_USAGE = """\
Resource usage:
 Common:
  GLOBAL:0
 Function _ZN2fa7stage1121hopper_forward_kernelI6__halfLi128ENS0_5StepNILi3EEEEvNS0_4ArgsIT_EE:
  REG:168 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:896 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _ZN2fa7stage1121hopper_forward_kernelI13__nv_bfloat16Li64ENS0_13TimelineStepNILi3EEEEvNS0_4ArgsIT_EE:
  REG:170 STACK:0 SHARED:0 LOCAL:8 CONSTANT[0]:896 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _ZN2fa7stage1121hopper_forward_kernelI13__nv_bfloat16Li64ENS0_5StepNILi1EEEEvNS0_4ArgsIT_EE:
  REG:199 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:896 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _ZN2fa7stage0720flash_forward_kernelI13__nv_bfloat16Li64EEEvNS0_4ArgsIT_EE:
  REG:128 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:896 TEXTURE:0 SURFACE:0 SAMPLER:0
"""

SMI = (f"name, compute_cap, clocks.current.sm [MHz], clocks.max.sm [MHz], driver_version\n"
       f"{H100}, 9.0, 345 MHz, 1980 MHz, 580\n")


class Record(unittest.TestCase):
    def test_the_record_reads_back(self):
        runs = [bringup11.timed_run(0, "stage 07", "stage11_hopper_kernel --step 0 ...", RUN_D64),
                bringup11.timed_run(3, "producer warpgroup", "stage11_hopper_kernel --step 3 ...", RUN_D128)]
        record = bringup11.first_contact("bringup11.log", "a GPU nvidia-smi named", CEILINGS, runs)
        self.assertEqual((record["format"], record["version"], record["log"]), (readers.FIRST_CONTACT_FORMAT, 1,
                                                                                 "bringup11.log"))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, bringup11.RECORD)
            bringup11.write_json(path, record)
            back = readers.read_first_contact(path)
        self.assertEqual(back["gpu"], H100)  # the ceilings' name of the GPU before nvidia-smi's
        self.assertEqual(back["ceilings"], {"wgmma_ss_bf16": 887.4, "wgmma_rs_fp16": 898.9})
        self.assertEqual([(r["step"], r["step_name"], r["dtype"], r["d"], r["N"], r["causal"], r["median_ms"])
                          for r in back["runs"]],
                         [(0, "stage 07", "bf16", 64, 4096, False, 0.2),
                          (3, "producer warpgroup", "bf16", 128, 4096, True, 0.25)])
        self.assertAlmostEqual(back["runs"][0]["tflops"], 343.59738)  # gflops / 1000

    def test_without_ceilings_the_gpu_is_nvidia_smis(self):
        self.assertEqual(bringup11.first_contact("x.log", H100, [], [])["gpu"], H100)
        self.assertEqual(bringup11.gpu_of_smi(SMI), H100)
        self.assertEqual(bringup11.gpu_of_smi(None), "")


class Readers(unittest.TestCase):
    def test_road_names_from_help(self):
        names = bringup11.road_names(HELP)
        self.assertEqual(names, {0: "stage 07", 1: "wgmma", 2: "TMA ring", 3: "producer warpgroup"})
        self.assertEqual(bringup11.chosen_steps("all", names, 1), [1, 2, 3])
        self.assertEqual(bringup11.chosen_steps("0,2", names, 1), [0, 2])
        self.assertEqual(bringup11.road_names("no such option"), {})

    def test_sass_counts_per_group(self):
        groups = bringup11.sass_counts(SASS)
        self.assertEqual(bringup11.sass_lines(groups),
                         ["stage 11: 2 HGMMA", "other kernels: 1 HMMA", "stage 11: 1 UTMALDG"])

    def test_registers_per_stage_11_instance(self):
        self.assertEqual(bringup11.register_lines(RES_USAGE), [
            "step 1 d=64 nv_bfloat16: REG 199, LOCAL 0 (spill bytes)",
            "step 3 d=128 half: REG 168, LOCAL 0 (spill bytes)",
            "step 3 d=64 nv_bfloat16 (instrumented): REG 170, LOCAL 8 (spill bytes)",
        ])


class FakeMachine:
    """A clock, a runner and a capture for BringUp: each command takes `cost` seconds; those whose
    line holds a key of `codes` exit with its value; a timed run appends RUN_D64 to its --json file."""

    def __init__(self, cost=1, codes=None):
        self.now, self.cost, self.codes, self.calls = 0.0, cost, codes or {}, []

    def clock(self):
        return self.now

    def execute(self, argv, env, limit, keep, out):
        line = bringup11.shell_line(argv, env)
        self.calls.append((line, env, limit))
        self.now += self.cost
        if "--json" in argv and "--bench" in argv:
            with open(argv[argv.index("--json") + 1], "a") as f:
                f.write(json.dumps(RUN_D64) + "\n")
        if "wgmma_ceiling" in argv[0]:
            with open(argv[argv.index("--json") + 1], "w") as f:
                f.write("".join(json.dumps(c) + "\n" for c in CEILINGS))
        return next((rc for key, rc in self.codes.items() if key in line), 0)

    def capture(self, argv, limit=60):
        if argv[0] == "nvidia-smi":
            return SMI
        if argv[-1] == "--help":
            return HELP
        return {"-sass": SASS, "-res-usage": RES_USAGE}.get(argv[1] if len(argv) > 1 else "")


def bring_up(machine, budget=1000, steps="all", timed="0,2,3"):
    """bring_up() on the fake machine: (exit code, output, the record, the results folder's files)."""
    out = io.StringIO()
    with tempfile.TemporaryDirectory() as tmp:
        b = bringup11.BringUp("build", budget, out, machine.clock, machine.execute, machine.capture)
        rc = bringup11.bring_up(b, steps, timed, tmp, "bringup11.log")
        with open(os.path.join(tmp, bringup11.RECORD)) as f:
            record = json.load(f)
        files = sorted(os.listdir(tmp))
    return rc, out.getvalue(), record, files


class Parts(unittest.TestCase):
    def test_every_part_in_order(self):
        machine = FakeMachine()
        rc, out, record, files = bring_up(machine)
        self.assertEqual(rc, 0, out)
        lines = [c[0] for c in machine.calls]
        self.assertTrue(lines[0].endswith("tests/test_hopper_layouts"))
        self.assertEqual(lines[1], "env FA_CUDA_SYNC=1 build/tests/test_hopper_wrappers")
        self.assertEqual(sum("FA_CUDA_SYNC=1" in line and "--step" in line for line in lines), 6)  # steps 1-3, two each
        self.assertIn("steps that finished: 1,2,3", out)
        self.assertEqual(sum("--bench" in line for line in lines), 12)  # steps 0, 2, 3 at four shapes
        self.assertTrue(lines[-1].startswith("build/bench/wgmma_ceiling --target-ms 5 --repeat 20 --json"))
        self.assertEqual([r["step"] for r in record["runs"]], [0, 2, 3] * 4)
        self.assertEqual(record["runs"][1]["step_name"], "TMA ring")
        self.assertEqual(record["ceilings"], {"wgmma_ss_bf16": 887.4, "wgmma_rs_fp16": 898.9})
        self.assertIn("stage 11: 2 HGMMA", out)
        self.assertIn("step 1 d=64 nv_bfloat16: REG 199, LOCAL 0 (spill bytes)", out)
        self.assertIn("stage11_bench_step3_d128_causal.jsonl", files)
        self.assertIn(bringup11.CEILINGS, files)

    def test_a_step_that_hangs_is_left_out_after(self):
        machine = FakeMachine(codes={"--step 2 --heads 3": bringup11.HUNG})
        rc, out, record, _ = bring_up(machine)
        self.assertEqual(rc, 1)
        self.assertIn("steps that finished: 1,3", out)
        self.assertIn("hung (killed at its limit): env FA_CUDA_SYNC=1 "
                      "build/stages/11_hopper_kernel/stage11_hopper_kernel --step 2 --heads 3", out)
        self.assertEqual({r["step"] for r in record["runs"]}, {0, 3})
        tests = [(line, env) for line, env, _ in machine.calls if "test_stage11 " in line]
        self.assertTrue(tests and all(env == {"FA_STAGE11_STEPS": "1,3"} for _, env in tests))
        cases = [line.split("--test-case=")[1].rstrip("'") for line, _ in tests]
        # No step past 3 finished: the shared cases come first.
        self.assertEqual(cases, list(bringup11.SHARED_CASES) + ["*step 1 (*", "*step 3 (*"])

    def test_the_new_steps_cases_come_first(self):
        self.assertEqual(bringup11.test_cases([1, 4, 5]),
                         ["*step 4 (*", "*step 5 (*", *bringup11.SHARED_CASES, "*step 1 (*"])

    def test_a_failure_that_is_not_a_hang_keeps_the_step(self):
        machine = FakeMachine(codes={"--step 1 --heads 2": 1})
        rc, out, _, _ = bring_up(machine, timed="1")
        self.assertEqual(rc, 1)
        self.assertIn("steps that finished: 1,2,3", out)
        self.assertIn("failed (exit 1): env FA_CUDA_SYNC=1", out)

    def test_the_budget_cuts_limits_and_skips_the_rest(self):
        machine = FakeMachine(cost=20)
        rc, out, record, _ = bring_up(machine, budget=70)
        limits = [limit for _, _, limit in machine.calls]
        self.assertEqual(limits, [60, 50, 30, 10])  # 60 and 120 s, then 30 s each, cut to what is left
        self.assertEqual(rc, 0)  # nothing that ran failed
        self.assertIn("[skipped: the 70-second budget is spent]", out)
        self.assertRegex(out, r"skipped, the budget spent: [0-9]+ command\(s\), from env FA_CUDA_SYNC=1 ")
        self.assertEqual(record["runs"], [])  # the timed runs were skipped
        self.assertIn("steps that finished: 1,2,3", out)  # skipped is not hung: as the bash script had it

    def test_no_hgmma_in_stage_11_fails(self):
        machine = FakeMachine()
        machine.capture = lambda argv, limit=60: SASS.replace("HGMMA", "HMMA") if "-sass" in argv else None
        rc, out, _, _ = bring_up(machine, steps="1", timed="0")
        self.assertEqual(rc, 1)
        self.assertIn("failed: no HGMMA in stage 11's kernels", out)


class Processes(unittest.TestCase):
    def test_a_command_past_its_limit_is_killed(self):
        with tempfile.TemporaryFile("w+") as out:
            sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
            self.assertEqual(bringup11.run_process(sleeper, {}, 0.5, None, out), bringup11.HUNG)
            self.assertEqual(bringup11.run_process(["/nonexistent/exe"], {}, 5, None, out), 127)

    def test_kept_lines(self):
        out = io.StringIO()
        code = "print('config x'); print('noise'); print('bench y')"
        rc = bringup11.run_process([sys.executable, "-c", code], {}, 10, bringup11.BENCH_LINE.search, out)
        self.assertEqual((rc, out.getvalue()), (0, "config x\nbench y\n"))


class TheExperiment(unittest.TestCase):
    def test_dry_run_prints_the_command(self):
        rc, out, _ = dry("bringup11", "--set", "bringup11.steps=1,2", "--set", "bringup11.budget=300")
        self.assertEqual(rc, 0, out)
        self.assertIn("python3 bench/bringup11.py --build /nonexistent/build-test --steps 1,2 --timed 0,3,4,5,6,7,8 "
                      "--budget 300 --out /nonexistent/work-test/results/bringup11 --log-name bringup11.log", out)
        self.assertIn("ninja ", out)
        for target in bringup11.TARGETS:
            self.assertIn(target, out)

    def test_bad_parameters_are_refused(self):
        for bad in ("bringup11.steps=one", "bringup11.budget=1", "bringup11.timed=all"):
            with self.subTest(bad):
                self.assertEqual(dry("bringup11", "--set", bad)[0], 2)

    def test_summary_from_the_log_and_the_record(self):
        exp = registry.experiments()["bringup11"]
        with tempfile.TemporaryDirectory() as tmp:
            log = os.path.join(tmp, "bringup11.log")
            with open(log, "w") as f:
                f.write("stage 11: 2 HGMMA\nnoise\nsteps that finished: 1,3\n\n=== done in 9 s (budget 170 s)\n"
                        "verdict: FAILED\n")
            run = bringup11.timed_run(3, "producer warpgroup", "...", RUN_D64)
            record = bringup11.first_contact("bringup11.log", H100, CEILINGS, [run])
            bringup11.write_json(os.path.join(tmp, bringup11.RECORD), record)
            lines = exp.summary(Where(tmp, log, dict(exp.params)))
        self.assertEqual(lines, ["stage 11: 2 HGMMA", "steps that finished: 1,3",
                                 "step 3 (producer warpgroup) d 64 N 4096 non-causal: 343.6 TFLOP/s",
                                 "wgmma ceilings: wgmma_ss_bf16 887.4, wgmma_rs_fp16 898.9 TFLOP/s",
                                 "=== done in 9 s (budget 170 s)", "verdict: FAILED"])

    def test_the_record_names_the_scripts_targets(self):
        exp = registry.experiments()["bringup11"]
        self.assertEqual(exp.targets, tuple(bringup11.TARGETS))
        self.assertIn(bringup11.RECORD, exp.outputs)


if __name__ == "__main__":
    unittest.main()
