"""Tests of the session driver without a GPU: the records are complete, `list` shows them, a dry run
prints each experiment's commands, --set is typed and refused with exit 2 when wrong, and the
experiments of one call share one results folder and one packed archive.

    python3 -m unittest discover -s bench/session -p 'test_*.py'     (from the repository root; CTest runs it)

Fast (about a second): the only programs run are small fakes and python3 itself.
"""
import contextlib
import io
import os
import stat
import sys
import tarfile
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))  # bench/: the package `session`

import ncu_pages  # noqa: E402  (bench/ncu_pages.py)
from session import cli, ncu, registry, runner, sanitize, stage05, stage11, tools  # noqa: E402
from session.experiment import (ALL_TARGETS, Command, Experiment, format_value, parse_value,  # noqa: E402
                                resolve_params)

BUILD = "/nonexistent/build-test"
WORK = "/nonexistent/work-test"


def call(*argv):
    """main(argv) from the repository root: (exit code, stdout, stderr)."""
    out, err, cwd = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main(list(argv))
            except SystemExit as e:  # argparse's own refusals
                rc = e.code
    finally:
        os.chdir(cwd)
    return rc, out.getvalue(), err.getvalue()


def dry(*argv):
    return call("run", *argv, "--dry-run", "--build", BUILD, "--work", WORK, "--out", "/nonexistent/out-test")


def dry_outside(name, exp):
    """dry(name), with the folders a fresh-copy check empties set outside this tree: their defaults
    (/tmp/fa-newcomer...) are refused where the tree is such a copy."""
    sets = []
    for key in ("dir", "test_dir"):
        if key in exp.params:
            sets += ["--set", f"{name}.{key}=/nonexistent/{key}"]
    return dry(name, *sets)


def dry_commands(exp):
    """The experiment's commands at its defaults, as a dry run forms them."""
    ctx = runner.Context(WORK, BUILD, "/nonexistent/out", dry_run=True)
    return list(exp.commands(dict(exp.params), ctx))  # a list, or a generator (ncucudnn11)


class Records(unittest.TestCase):
    def setUp(self):
        self.exps = registry.experiments()

    def test_every_record_is_complete(self):
        for name, exp in self.exps.items():
            with self.subTest(name):
                self.assertTrue(exp.description and exp.stage and exp.summary_text())
                self.assertEqual(set(exp.params), set(exp.param_help), "every parameter says what it is")
                for param, default in exp.params.items():
                    self.assertIsNotNone(default)
                    # A default is --set-able as list shows it: its text gives it back.
                    self.assertEqual(parse_value(default, format_value(default)), default, param)
                cmds = dry_commands(exp)
                self.assertTrue(cmds, "it runs something")
                runs_ctest = any(c.argv[0] == "ctest" for c in cmds)
                self.assertTrue(exp.outputs or runs_ctest, "its outputs are named (ctest writes only its log)")
                if any(BUILD + "/" in str(a) for c in cmds for a in c.argv):  # a path in the build folder
                    self.assertTrue(exp.targets, "it runs a built binary, so it names its targets")

    def test_modules_hold_their_stage(self):
        for module in registry.MODULES:
            stage = module.__name__.rsplit("stage", 1)[-1] if "stage" in module.__name__ else "all"
            for exp in module.EXPERIMENTS:
                self.assertEqual(exp.stage, stage, exp.name)


class List(unittest.TestCase):
    def test_list_shows_every_experiment_with_its_defaults(self):
        rc, out, _ = call("list")
        self.assertEqual(rc, 0)
        for name, exp in registry.experiments().items():
            self.assertRegex(out, rf"(?m)^{name}  \(stage {exp.stage}\)$")
            for param, default in exp.params.items():
                self.assertIn(f"{param}={format_value(default)}", out)
            for output in exp.outputs:
                self.assertIn(output, out)

    def test_list_refuses_an_unknown_name(self):
        rc, _, err = call("list", "nope")
        self.assertEqual(rc, 2)
        self.assertIn("nope", err)


class DryRun(unittest.TestCase):
    def test_each_experiment_prints_its_commands(self):
        for name, exp in registry.experiments().items():
            with self.subTest(name):
                rc, out, _ = dry_outside(name, exp)
                self.assertEqual(rc, 0, out)
                self.assertIn(f"{WORK}/results/{name}", out)
                self.assertIn(BUILD, out)
                for cmd in dry_commands(exp):
                    self.assertIn(os.path.basename(str(cmd.argv[1 if cmd.argv[0] == "timeout" else 0])), out)

    def test_build_flags_and_targets(self):
        rc, out, _ = dry("road11", "ceiling")
        self.assertEqual(rc, 0)
        configure = next(line for line in out.splitlines() if line.startswith("cmake "))
        for flag in ("-DCMAKE_CUDA_ARCHITECTURES=90", "-DFA_BUILD_DOCS=OFF", "-DFA_WERROR=ON", f"-B {BUILD}"):
            self.assertIn(flag, configure)
        ninja = next(line for line in out.splitlines() if line.startswith("ninja "))
        self.assertIn("bench_gpu mma_ceiling wgmma_ceiling", ninja)  # the union, once each

    def test_all_targets_build_everything(self):
        rc, out, _ = dry("test", "road11")
        ninja = next(line for line in out.splitlines() if line.startswith("ninja "))
        self.assertRegex(ninja, rf"^ninja -C {BUILD} -j16 -k 0 >")
        self.assertEqual(ALL_TARGETS, registry.experiments()["test"].targets)

    def test_no_build(self):
        rc, out, _ = dry("road11", "--no-build")
        self.assertEqual(rc, 0)
        self.assertNotIn("ninja", out)

    def test_ceilings_measured_earlier_in_the_call_are_reused(self):
        _, alone, _ = dry("road11")
        _, after, _ = dry("ceiling", "road11")
        self.assertNotIn("--mma-ceiling-json", alone)
        self.assertIn(f"--mma-ceiling-json {WORK}/results/ceiling/mma_ceiling.jsonl", after)


class Set(unittest.TestCase):
    def test_set_changes_exactly_the_named_parameter(self):
        exp = registry.experiments()["road11"]
        params = resolve_params(exp, {"steps": "0,8,9"})
        changed = {k for k in params if params[k] != exp.params[k]}
        self.assertEqual(changed, {"steps"})
        self.assertEqual(params["steps"], ("0", "8", "9"))
        rc, out, _ = dry("road11", "sweep09", "--set", "road11.steps=0,8,9")
        self.assertEqual(rc, 0)
        self.assertIn("--steps11 0 8 9 --sizes 1024 4096 16384", out)
        self.assertIn("--stages 07 09 --dtypes bf16 fp16 --sizes 512 1024 2048 4096 8192 16384 --repeat 30 --steps09 1",
                      out)  # sweep09 untouched
        rc, out, _ = dry("sweep09", "--set", "sweep09.steps09=none", "--set", "sweep09.dtypes=fp16")
        self.assertEqual(rc, 0)
        self.assertIn("--dtypes fp16 --sizes", out)
        self.assertNotIn("--steps09", out)  # none: no other step beside the default

    def test_typed_values(self):
        exp = registry.experiments()["ncu11road"]
        params = resolve_params(exp, {"causal": "yes", "dims": "128", "size": "1024"})
        self.assertEqual((params["causal"], params["dims"], params["size"]), (True, (128,), 1024))
        rc, out, _ = dry("ncu11road", "--set", "ncu11road.causal=yes", "--set", "ncu11road.dims=128")
        self.assertIn("--causal yes", out)
        self.assertNotIn("--head-dims 64", out)

    def test_bad_sets_exit_2_naming_what_is_wrong(self):
        cases = {
            "road11.sizes=abc": ["road11.sizes", "integer"],
            "road11.nope=1": ["nope", "steps"],
            "road11.steps=all,x": ["steps", "0,8,9"],
            "road11.dtypes=fp8": ["bf16"],
            "ncu11road.causal=maybe": ["causal", "boolean"],
            "timeline11.shapes=128x4096": ["d:N:causal"],
            "sweep07.rounds=3": ["sweep07", "not run"],
            "road11=3": ["EXP.PARAM=VALUE"],
            "road11.rounds=2.5": ["rounds", "integer"],
        }
        for item, words in cases.items():
            with self.subTest(item):
                exp = item.split(".")[0].split("=")[0]
                names = ["road11"] if exp == "sweep07" else [exp]
                rc, out, err = dry(*names, "--set", item)
                self.assertEqual(rc, 2)
                self.assertEqual(out, "", "nothing runs")
                for word in words:
                    self.assertIn(word, err)

    def test_unknown_experiment_exits_2_with_the_list(self):
        rc, _, err = dry("road11", "road12")
        self.assertEqual(rc, 2)
        self.assertIn("unknown experiment road12", err)
        self.assertIn("road11", err)


# The experiments ported after the first twelve: each must dry-run (DryRun checks every experiment the
# same way); this list keeps one from leaving the registry unnoticed.
PORTED_LATER = (
    "sanitize", "sanitize05", "sanitize06", "sanitize07", "sanitize07m", "sanitize09", "sanitize09m", "sanitize11",
    "quick", "sweep", "groups11", "ncu11", "ncucudnn11", "ncusource11", "ncu09", "ncu09at", "ncuflash09", "ncudrop",
    "ncugqa", "ncusource09", "ncuvarlen09", "road05", "ncu", "ncu05road", "ncu07", "ncu07road", "switches07", "stage10",
    "order07", "order09", "split09", "timing", "lessons", "prebuilt",
)


def shell_lines(exp_name, *sets):
    """The dry run's command lines of one experiment (comments and notes left out)."""
    rc, out, err = dry(exp_name, "--no-build", *(x for s in sets for x in ("--set", s)))
    assert rc == 0, err
    return [line for line in out.splitlines() if line and not line.startswith(("#", "====="))]


class Ported(unittest.TestCase):
    def test_every_later_port_is_registered_and_dry_runs(self):
        exps = registry.experiments()
        for name in PORTED_LATER:
            with self.subTest(name):
                self.assertIn(name, exps)
                self.assertTrue(shell_lines(name), "it prints its commands")

    def test_sanitize_options_per_tool_and_stage(self):
        lines = shell_lines("sanitize", "sanitize.stages=07,07m,09m", "sanitize.tools=memcheck,racecheck")
        memcheck = [line for line in lines if "--tool memcheck" in line]
        racecheck = [line for line in lines if "--tool racecheck" in line]
        self.assertEqual(len(memcheck), len(racecheck))
        self.assertTrue(all("--leak-check full" in line for line in memcheck))
        self.assertFalse(any("--leak-check" in line for line in racecheck))
        for line in lines:
            self.assertEqual("tests/test_stage" not in line, "--reference never" in line, line)
        self.assertEqual(len(lines), 2 * (len(sanitize.CASES07) + len(sanitize.CASES07M) + 4))
        # a doctest filter holding a comma stays one argument
        self.assertIn("'-tc=*stage?09?with?dropout*,*regenerates?stage?07?s?dropout?mask*'", "\n".join(lines))

    def test_sanitize_steps_and_cases_from_parameters(self):
        lines = shell_lines("sanitize11", "sanitize11.steps=1,3", "sanitize11.tools=synccheck")
        self.assertEqual(len(lines), 2 * len(sanitize.CASES11))
        self.assertTrue(all(line.split(" >>")[0].endswith(("--step 1 --reference never", "--step 3 --reference never"))
                            for line in lines))
        lines = shell_lines("sanitize09m", "sanitize09m.cases=-tc=*a*|-tc=*b*", "sanitize09m.tools=initcheck")
        self.assertEqual(len(lines), 2)
        rc, _, err = dry("sanitize05", "--set", "sanitize05.tools=memcheck,nope")
        self.assertEqual(rc, 2)
        self.assertIn("memcheck", err)
        rc, _, err = dry("sanitize", "--set", "sanitize.stages=05,08")
        self.assertEqual(rc, 2)
        self.assertIn("08", err)

    def test_road_steps_of_stage_09_from_its_help(self):
        ctx = runner.Context(WORK, BUILD, "/nonexistent/out", dry_run=False)
        ctx.help_text = lambda exe: "  --step INT:INT in [0 - 4]  which step of the road runs (default: step 3):"
        steps, note = sanitize.road_steps(ctx, "09", ("all",), 0)
        self.assertEqual(steps, ["0", "1", "2", "3", "4"])
        self.assertIn("of 0 to 4", note)
        self.assertEqual(sanitize.road_steps(ctx, "11", ("all",), 1)[0], ["1", "2", "3", "4"])

    def test_packed_lengths_as_the_script_drew_them(self):
        self.assertEqual(tools.packed_lengths(), "2780,7892,1363,3362,987")
        self.assertIn("--varlen07 2780,7892,1363,3362,987", "\n".join(shell_lines("stage10")))
        self.assertNotIn("--varlen07", "\n".join(shell_lines("stage10", "stage10.varlen=false")))

    def test_split09_skips_splits_that_do_not_divide_the_group(self):
        lines = shell_lines("split09", "split09.rounds=1")
        splits = [line.split()[0] for line in lines]
        self.assertEqual(len(lines), 5 + 4)  # 8:1 takes 1 2 4 8 0, 4:1 takes 1 2 4 0
        self.assertEqual(splits.count("FA_STAGE09_GROUP_SPLIT=8"), 1)

    def test_block_orders_interleave_rounds(self):
        lines = shell_lines("order09", "order09.rounds=2")
        self.assertEqual([line.split()[0] for line in lines], ["FA_STAGE09_BLOCK_ORDER=key-blocks",
                                                                "FA_STAGE09_BLOCK_ORDER=heads"] * 2)

    def test_ncu_reports_and_regexes(self):
        lines = shell_lines("ncu09at", "ncu09at.at=9:128")
        self.assertIn(r"--kernel-name-base demangled -k 'regex:flash_backward_tiled_kernel<[^,]*, \(int\)128, "
                      r"[^<]*WithDqTiles<", "\n".join(lines))
        report = f"{WORK}/results/ncu09at/ncu_stage09_step9_d128_metrics"
        self.assertTrue(any(f"--force-overwrite --export {report} " in line and "| strip_bench >> " in line
                            for line in lines), "the counters' report kept in the results folder")
        self.assertIn(f"ncu --import {report}.ncu-rep --csv --page raw --print-units base --print-kernel-base demangled "
                      f"> {report}.csv 2>> {WORK}/logs/ncu09at.log", lines)
        cudnn = "\n".join(shell_lines("ncucudnn11", "ncucudnn11.points=64:4096:yes"))
        self.assertIn("--head-dim 64 --causal", cudnn)
        self.assertIn("regex:^<the-kernel-named-in-cudnn_longest_d64_n4096_causal.txt>$", cudnn)
        rc, _, err = dry("ncugqa", "--set", "ncugqa.stage=11")
        self.assertEqual(rc, 2)

    def test_every_profile_is_a_report_with_its_data_as_csv(self):
        """Each ncu run of an Nsight experiment exports a report into the experiment's results folder,
        and each report is printed as a CSV page (raw, or source): nothing is read from printed text."""
        for name, exp in registry.experiments().items():
            argvs = [[str(a) for a in c.argv] for c in dry_commands(exp) if "ncu" in [str(a) for a in c.argv[:3]]]
            if not argvs:
                continue
            with self.subTest(name):
                results = f"{WORK}/results/{name}/"
                reports = [a[a.index("--export") + 1] for a in argvs if "--export" in a]
                imports = [a for a in argvs if "--import" in a]
                self.assertTrue(reports)
                self.assertTrue(all(r.startswith(results) for r in reports))
                self.assertEqual(len(reports) + len(imports), len(argvs), "each ncu run profiles or prints a report")
                printed = {a[a.index("--import") + 1] for a in imports}
                self.assertEqual(printed, {r + ".ncu-rep" for r in reports})
                for a in imports:
                    self.assertIn("--csv", a)
                    self.assertIn(a[a.index("--page") + 1], ("raw", "source"))
                for r in reports:
                    self.assertTrue(any(o.endswith(".ncu-rep") and os.path.basename(r).startswith(o[:-8].split("{")[0])
                                        for o in exp.outputs), f"{r}.ncu-rep among the outputs")

    def test_strip_bench(self):
        kept = ncu.strip_bench(["[ 1/ 4] stage 07 ...", "gpu NVIDIA H200", "  vs SDPA",
                                "    gpu__time_duration.sum  us  12.5", "==PROF== Disconnected"])
        self.assertEqual(kept, ["    gpu__time_duration.sum  us  12.5", "==PROF== Disconnected"])
        self.assertEqual(ncu.strip_bench_and_ncu(kept), kept[:1])


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def raw_page(metrics):
    """A raw page of one launch as `ncu --import R --csv --page raw --print-units base` prints it:
    the column names, the units, the launch. metrics: name -> (unit, value as printed)."""
    launch = ("0", "1", "bench_gpu", "h", "void k<64>(Args)", "1", "7", "(128, 1, 1)", "(4096, 1, 1)", "0", "9.0")
    rows = (ncu_pages.IDENTITY + tuple(metrics), ("",) * len(launch) + tuple(u for u, _ in metrics.values()),
            launch + tuple(v for _, v in metrics.values()))
    return "".join(",".join(f'"{c}"' for c in row) + "\n" for row in rows)


class Tables(unittest.TestCase):
    """The tables the script drew with heredocs and awk, from small made-up records."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_groups11_table(self):
        head = "impl,gpu,date,B,H,d,N,step,tflops\n"
        for mib, s6 in ((4, 110.0), (1073741824, 90.0)):
            write(os.path.join(self.dir, f"sweep_{mib}.csv"),
                  head + f"stage11,H200,2026-11-28,4,16,128,4096,5,100.0\nstage11,H200,2026-11-28,4,16,128,4096,6,{s6}\n"
                  "sdpa,H200,2026-11-28,4,16,128,4096,,300\n")
        lines, best = stage11.groups11_table(self.dir)
        self.assertEqual(best, 4)
        self.assertIn("best budget: 4 MiB", lines)
        self.assertRegex(lines[3], r"^  4  16  128   4096   100.0 \[100-100\] +110.0 +90.0   1.10$")

    def test_road05_table(self):
        path = os.path.join(self.dir, "road05.csv")
        write(path, "impl,gpu,date,d,N,step,step_name,median_ms,tflops,check\n"
                    "stage05,H200,2026-11-28,64,1024,0,naive,2.0,1.0,ok\nstage05,H200,2026-11-28,64,1024,1,tiles,1.0,2.5,\n")
        lines = stage05.road05_table(path)
        self.assertIn("stage 05's road", lines[0])
        self.assertTrue(lines[2].endswith("     -  ok"))
        self.assertTrue(lines[3].endswith(" 2.50x  -"))

    def test_dropout_and_gqa_price(self):
        page = raw_page({"device__attribute_display_name": ("", "NVIDIA H200"),
                         "dram__bytes_read.sum": ("byte", "2,000,000,000"),
                         "gpu__time_duration.sum": ("nsecond", "1,500,000"),
                         "sm__cycles_active.avg": ("cycle", "100"), "sm__cycles_active.max": ("cycle", "200"),
                         "smsp__inst_executed.sum": ("inst", "1,000,000")})
        write(os.path.join(self.dir, "ncu_stage07_dropout0.1_d64_metrics.csv"), page)
        write(os.path.join(self.dir, "ncu_stage09_gqa4_d128_metrics.csv"), page)
        drop = ncu.dropout_price_table(self.dir)
        self.assertEqual(len(drop), 2)
        self.assertRegex(drop[1], r"^stage07 +64  0.1 +1500 +1000000 ")
        gqa = ncu.gqa_price_table(self.dir, "09", 128, ("plain", "4", "8"))
        self.assertEqual(len(gqa), 2)
        self.assertRegex(gqa[1], r"^4 +1500 +1000000 .* 2.00 .* 2000$")
        # The same rows as CSV: a counter the report lacks is an empty cell, not a 0.
        table = os.path.join(self.dir, "gqa_price.csv")
        ncu.write_table(table, ncu.GQA_COLUMNS, ncu.gqa_price(self.dir, "09", 128, ("plain", "4", "8")))
        with open(table) as f:
            rows = [line.rstrip("\n").split(",") for line in f]
        self.assertEqual(rows[0][:3], ["groups", "time_us", "warp_inst"])
        self.assertEqual(rows[1][:3], ["4", "1500", "1000000"])
        self.assertEqual(rows[1][rows[0].index("busiest_over_avg")], "2")
        self.assertEqual(rows[1][rows[0].index("issue_pct")], "")

    def test_summaries_read_the_raw_pages(self):
        page = raw_page({"gpu__time_duration.sum": ("nsecond", "6,140,000"),
                         "launch__registers_per_thread": ("register/thread", "254"),
                         "sm__warps_active.avg.pct_of_peak_sustained_active": ("%", "12.33")})
        write(os.path.join(self.dir, "r.csv"), page)
        write(os.path.join(self.dir, "r_metrics.csv"), page)
        lines = ncu.report_lines(self.dir, "r", counters="registers")
        self.assertEqual(lines[0], "  void k<64>(Args) (4096, 1, 1)x(128, 1, 1)")
        self.assertEqual(lines[1].split(), ["gpu__time_duration.sum", "nsecond", "6,140,000"])
        self.assertEqual([line.split()[0] for line in lines[2:]], ["sm__warps_active.avg.pct_of_peak_sustained_active",
                                                                  "launch__registers_per_thread",
                                                                  "launch__registers_per_thread"])
        self.assertEqual(ncu.launch_lines(self.dir, "r", "missing")[-1], "-- missing: no launch")


def toy(name, *makers):
    """An experiment of the commands makers(ctx) give, whose summary is its a.txt."""
    return Experiment(name=name, stage="00", description="a toy", targets=(), params={}, param_help={},
                      commands=lambda p, ctx: [m(ctx) for m in makers], outputs=("a.txt",), summary="a.txt")


class Run(unittest.TestCase):
    """Real runs of small fakes: the call's folders, its summary, its archive."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.work, self.out = os.path.join(self.tmp.name, "work"), os.path.join(self.tmp.name, "out")

    def tearDown(self):
        self.tmp.cleanup()

    def writer(self, name, text):
        path = lambda ctx: os.path.join(ctx.results(name), "a.txt")  # noqa: E731
        return lambda ctx: Command((sys.executable, "-c", f"open({path(ctx)!r}, 'w').write({text!r})"))

    def test_two_experiments_share_one_results_folder_and_archive(self):
        ctx = runner.Context(self.work, os.path.join(self.tmp.name, "build"), self.out)
        planned = [(toy("one", self.writer("one", "first\n")), {}), (toy("two", self.writer("two", "second\n")), {})]
        with contextlib.redirect_stdout(io.StringIO()):
            rc = runner.run_all(ctx, planned, "ON", do_build=False, pack_every=30)
        self.assertEqual(rc, 0)
        self.assertEqual(sorted(os.listdir(os.path.join(self.work, "results"))), ["one", "two"])
        with tarfile.open(os.path.join(self.out, "session.tgz")) as tar:
            names = tar.getnames()
        self.assertIn("results/one/a.txt", names)
        self.assertIn("results/two/a.txt", names)
        with open(os.path.join(self.out, "summary.txt")) as f:
            summary = f.read()
        self.assertLess(summary.index("first\n"), summary.index("second\n"))  # each summary, in order
        self.assertRegex(summary, r"\[one: \d+ s, \d+ s since the start\]")
        self.assertIn("done, status 0", summary)

    def test_packs_during_an_experiment(self):
        archive = os.path.join(self.out, "session.tgz")
        wait = (f"import tarfile, time, sys\nfor _ in range(100):\n    time.sleep(0.05)\n    try:\n"
                f"        if 'results/slow/a.txt' in tarfile.open({archive!r}).getnames(): sys.exit(0)\n"
                f"    except Exception: pass\nsys.exit(1)")
        ctx = runner.Context(self.work, os.path.join(self.tmp.name, "build"), self.out)
        exp = toy("slow", self.writer("slow", "x\n"), lambda ctx: Command((sys.executable, "-c", wait)))
        with contextlib.redirect_stdout(io.StringIO()):
            rc = runner.run_all(ctx, [(exp, {})], "ON", do_build=False, pack_every=0.1)
        self.assertEqual(rc, 0, "the background packer packed the first file while the second command waited")

    def test_failure_and_tolerated_exit_codes(self):
        build = os.path.join(self.tmp.name, "build")
        os.makedirs(os.path.join(build, "bench"))
        fake = {"mma_ceiling": "echo mma 1000 TFLOP/s; echo '{}' > \"$2\"", "wgmma_ceiling": "echo no wgmma here; exit 77"}
        for exe, body in fake.items():
            path = os.path.join(build, "bench", exe)
            with open(path, "w") as f:
                f.write(f"#!/bin/sh\n{body}\n")
            os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
        rc, out, _ = call("run", "ceiling", "--no-build", "--build", build, "--work", self.work, "--out", self.out)
        self.assertEqual(rc, 0, out)  # 77: no Hopper GPU, recorded and not a failure
        self.assertIn("mma 1000 TFLOP/s", out)
        self.assertIn("no wgmma here", out)
        os.remove(os.path.join(build, "bench", "mma_ceiling"))
        rc, out, _ = call("run", "ceiling", "--no-build", "--build", build, "--work", self.work, "--out", self.out)
        self.assertEqual(rc, 1)
        self.assertIn("FAIL  ceiling: mma_ceiling", out)

    def test_a_filtered_command_and_a_separate_stderr(self):
        ctx = runner.Context(self.work, os.path.join(self.tmp.name, "build"), self.out)
        res = os.path.join(self.work, "results", "pipe")
        code = "import sys; print('keep'); print('gpu drop'); print('err', file=sys.stderr)"
        exp = toy("pipe", lambda ctx: Command((sys.executable, "-c", code), stdout=f"{res}/a.txt", filter=ncu.strip_bench),
                  lambda ctx: Command((sys.executable, "-c", code), stdout=f"{res}/b.txt", stderr=f"{res}/err.txt"))
        with contextlib.redirect_stdout(io.StringIO()):
            rc = runner.run_all(ctx, [(exp, {})], "ON", do_build=False, pack_every=30)
        self.assertEqual(rc, 0)
        for name, text in (("a.txt", ["keep", "err"]), ("b.txt", ["keep", "gpu drop"]), ("err.txt", ["err"])):
            with open(os.path.join(res, name)) as f:
                self.assertEqual(sorted(f.read().split("\n")[:-1]), sorted(text), name)


if __name__ == "__main__":
    unittest.main()
