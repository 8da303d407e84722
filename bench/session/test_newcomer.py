"""Tests of the fresh-copy checks (newcomer.py, bench/newcomer.sh) without a GPU: their records and
dry runs, and real runs on a small made-up tree whose scripts/course.sh and scripts/test.sh print
what the real ones print. The copy leaves the build folders and git's out, newcomer.txt and
newcomer_test.txt say what the bash driver's did, scripts/test.sh started by newcomer_test_start
runs on in a session of its own after the call returns, and newcomer_wait says when it still runs.

    python3 -m unittest discover -s bench/session -p 'test_*.py'     (from the repository root; CTest runs it)

A few seconds: newcomer_wait polls once a second.
"""
import contextlib
import io
import os
import shutil
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))  # bench/: the package `session`

from session import cli, newcomer, registry  # noqa: E402

NAMES = ("newcomer", "newcomer_test", "newcomer_test_start", "newcomer_wait")


def call_in(cwd, *argv):
    """main(argv) run from cwd: (exit code, stdout, stderr)."""
    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(list(argv))
    finally:
        os.chdir(here)
    return rc, out.getvalue(), err.getvalue()


def read(path):
    with open(path) as f:
        return f.read()


def write(path, text, executable=False):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))
    if executable:
        os.chmod(path, 0o755)


class Records(unittest.TestCase):
    def test_registered_without_targets(self):
        exps = registry.experiments()
        for name in NAMES:
            with self.subTest(name):
                self.assertIn(name, exps)
                self.assertEqual(exps[name].targets, (), "the copy builds itself")
                self.assertEqual(exps[name].stage, "all")

    def test_dry_run_prints_the_copy_the_environment_and_the_detached_start(self):
        # The copy's folder is set: the default, /tmp/fa-newcomer, is refused where this tree is that copy.
        rc, out, _ = call_in(ROOT, "run", "newcomer", "newcomer_test_start", "--dry-run", "--work", "/nonexistent/w",
                             "--set", "newcomer.dir=/nonexistent/copy", "--set", "newcomer_test_start.dir=/nonexistent/copy")
        self.assertEqual(rc, 0)
        self.assertNotRegex(out, r"(?m)^(cmake|ninja) ", "nothing to build")
        self.assertIn("bash bench/newcomer.sh copy /nonexistent/copy >>", out)
        self.assertIn("FA_SKIP_INSTALL=1 CMAKE_PREFIX_PATH=/tmp/deps/usr bash bench/newcomer.sh run /nonexistent/copy 900 "
                      "/nonexistent/w/results/newcomer/course_status.json scripts/course.sh > "
                      "/nonexistent/w/results/newcomer/course.log", out)
        self.assertIn("FA_SKIP_INSTALL=1 CMAKE_PREFIX_PATH=/tmp/deps/usr bash bench/newcomer.sh start /nonexistent/copy "
                      "1200 /tmp/fa-newcomer-test >", out)

    def test_the_copy_defaults_to_a_folder_of_tmp(self):
        exps = registry.experiments()
        for name in ("newcomer", "newcomer_test_start", "newcomer_test"):
            with self.subTest(name):
                self.assertEqual(exps[name].params["dir"], "/tmp/fa-newcomer")

    def test_the_tree_itself_is_never_the_copy(self):
        rc, out, err = call_in(ROOT, "run", "newcomer", "--dry-run", "--set", f"newcomer.dir={ROOT}/")
        self.assertEqual((rc, out), (2, ""))
        self.assertIn("outside the working tree", err)

    def test_parameters_and_a_call_with_a_build(self):
        rc, out, _ = call_in(ROOT, "run", "road11", "newcomer_wait", "--dry-run", "--set", "newcomer_wait.wait=60",
                             "--work", "/nonexistent/w")
        self.assertEqual(rc, 0)
        self.assertLess(out.index("ninja "), out.index("bench/newcomer.sh wait /tmp/fa-newcomer-test 60"))
        self.assertNotIn("newcomer.sh start", out)

    def test_folders_that_are_emptied_are_checked(self):
        for value in ("/", ROOT, os.path.dirname(ROOT), "relative/copy"):
            with self.subTest(value):
                rc, out, err = call_in(ROOT, "run", "newcomer", "--dry-run", "--set", f"newcomer.dir={value}")
                self.assertEqual(rc, 2)
                self.assertEqual(out, "")
                self.assertIn("outside the working tree", err)


class Readers(unittest.TestCase):
    def test_matches_with_after_as_grep_m_a(self):
        lines = ["a", "warning: 1", "b", "warning: 2", "c", "d", "e", "f", "warning: 3", "g"]
        self.assertEqual(newcomer.matches_with_after(lines, "warning:", 10, 1),
                         ["warning: 1", "b", "warning: 2", "c", "--", "warning: 3", "g"])
        self.assertEqual(newcomer.matches_with_after(lines, "warning:", 2, 3),
                         ["warning: 1", "b", "warning: 2", "c", "d", "e"])
        self.assertEqual(newcomer.matches_with_after(lines, "nothing", 10, 3), [])

    def test_cuda_targets_and_packages(self):
        with tempfile.TemporaryDirectory() as tmp:
            ninja = os.path.join(tmp, "build.ninja")
            write(ninja, "FLAGS = -gencode arch=compute_90a,code=[sm_90a]\n"
                         + "FLAGS = -gencode arch=compute_90,code=[compute_90,sm_90]\n" * 2)
            self.assertEqual(newcomer.cuda_targets(ninja),
                             "2 arch=compute_90,code=[compute_90,sm_90]; 1 arch=compute_90a,code=[sm_90a]")
            for deb in ("libeigen3-dev_3.4.0-4_all.deb", "nlohmann-json3-dev_3.11.2-2_all.deb"):
                write(os.path.join(tmp, ".deps", deb), "")
            here = os.getcwd()
            os.chdir(tmp)
            try:
                self.assertEqual(newcomer.packages(), "libeigen3-dev 3.4.0-4, nlohmann-json3-dev 3.11.2-2")
            finally:
                os.chdir(here)


class FreshCopy(unittest.TestCase):
    """Real runs in a made-up working tree: bench/newcomer.sh, and README commands that print the
    lines the records keep."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        t = self.tmp.name
        self.tree, self.copy, self.test_dir = os.path.join(t, "tree"), os.path.join(t, "copy"), os.path.join(t, "test")
        self.work, self.out, self.release = os.path.join(t, "work"), os.path.join(t, "out"), os.path.join(t, "release")
        os.makedirs(os.path.join(self.tree, "bench"))
        shutil.copy(os.path.join(ROOT, "bench", "newcomer.sh"), os.path.join(self.tree, "bench"))
        write(os.path.join(self.tree, "scripts", "course.sh"), """\
            #!/bin/sh
            cd "$(dirname "$0")/.."
            mkdir -p build
            echo 'FLAGS = arch=compute_90,code=[compute_90,sm_90]' > build/build.ninja
            echo "== flashcourse stage 01: naive attention =="
            echo "env $FA_SKIP_INSTALL $CMAKE_PREFIX_PATH"
            echo "a.cu(3): warning: unused"
            echo "  detail"
            echo "verdict    PASS: 2 comparisons within tolerance"
            echo "course: every stage built here ran and passed"
            """, executable=True)
        write(os.path.join(self.tree, "scripts", "test.sh"), f"""\
            #!/bin/sh
            awk '{{print $6}}' /proc/$$/stat > {self.tree}/../test_sid  # its session
            n=0
            while [ ! -f {self.release} ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
            echo "== default build (warnings as errors: OFF) =="
            echo "100% tests passed out of 84"
            """, executable=True)
        for left_out in ("build/CMakeCache.txt", "build-gpu/x", ".git/HEAD", ".whl/x.whl"):
            write(os.path.join(self.tree, left_out), "")

    def tearDown(self):
        write(self.release, "")  # a test.sh still waiting ends
        self.tmp.cleanup()

    def sets(self, name):
        keys = registry.experiments()[name].params
        return [x for k, v in (("dir", self.copy), ("test_dir", self.test_dir)) if k in keys
                for x in ("--set", f"{name}.{k}={v}")]

    def session(self, *names, extra=()):
        argv = ["run", *names, "--work", self.work, "--out", self.out, *extra]
        for name in names:
            argv += self.sets(name)
        return call_in(self.tree, *argv)

    def test_newcomer_and_newcomer_test_in_one_call(self):
        write(self.release, "")
        rc, out, _ = self.session("newcomer", "newcomer_test")
        self.assertEqual(rc, 0, out)
        self.assertEqual(sorted(os.listdir(self.copy)), ["bench", "build", "scripts"], "build*, .git, .whl left out")
        self.assertFalse(os.path.exists(os.path.join(self.copy, "build", "CMakeCache.txt")))
        record = read(os.path.join(self.work, "results", "newcomer", "newcomer.txt")).splitlines()
        self.assertTrue(record[0].startswith("A reader's first run on a GPU machine"))
        self.assertRegex(record[1], r"^date:     \d{4}-\d\d-\d\d \d\d:\d\d UTC$")
        for line, key in zip(record[2:7], ("gpu", "os", "c++", "nvcc", "cmake")):
            self.assertTrue(line.startswith(f"{key}:"), line)
        self.assertEqual(record[8], "          FA_SKIP_INSTALL=1 CMAKE_PREFIX_PATH=/tmp/deps/usr")
        self.assertRegex(record[9], r"^scripts/course\.sh: exit 0, \d+ s; compiler warnings in its build: 1$")
        self.assertEqual(record[10], "cuda targets: 1 arch=compute_90,code=[compute_90,sm_90]")
        verdict, last = "verdict    PASS: 2 comparisons within tolerance", "course: every stage built here ran and passed"
        self.assertEqual(record[11:], ["a.cu(3): warning: unused", "  detail", verdict, last,  # the warning, 3 lines after
                                       "== flashcourse stage 01: naive attention ==", verdict, last])
        self.assertIn("env 1 /tmp/deps/usr", read(os.path.join(self.work, "results", "newcomer", "course.log")))
        test = read(os.path.join(self.work, "results", "newcomer_test", "newcomer_test.txt")).splitlines()
        self.assertRegex(test[0], r"^scripts/test\.sh: exit 0, \d+ s \(\d{4}-\d\d-\d\d \d\d:\d\d UTC\); "
                                  r"compiler warnings in its builds: 0$")
        self.assertEqual(test[1:], ["== default build (warnings as errors: OFF) ==", "100% tests passed out of 84"])
        summary = read(os.path.join(self.out, "summary.txt"))
        self.assertIn("scripts/course.sh: exit 0", summary)
        self.assertIn("100% tests passed out of 84", summary)

    def test_two_parts_outlive_the_call(self):
        rc, out, _ = self.session("newcomer", "newcomer_test_start")
        self.assertEqual(rc, 0, out)
        self.assertIn("newcomer_wait collects it", out)
        self.assertFalse(os.path.exists(os.path.join(self.test_dir, "status.json")), "the call returned first")
        rc, out, _ = self.session("newcomer_wait", extra=("--set", "newcomer_wait.wait=0"))
        self.assertEqual(rc, 1)
        self.assertIn("still running after 0 s more", out)
        self.assertFalse(os.path.exists(os.path.join(self.work, "results", "newcomer_wait", "newcomer_test.txt")))
        with open(os.path.join(self.tmp.name, "test_sid")) as f:
            self.assertNotEqual(int(f.read()), os.getsid(0), "scripts/test.sh runs in a session of its own")
        write(self.release, "")
        rc, out, _ = self.session("newcomer_wait", extra=("--set", "newcomer_wait.wait=30"))
        self.assertEqual(rc, 0, out)
        test = read(os.path.join(self.work, "results", "newcomer_wait", "newcomer_test.txt"))
        self.assertRegex(test, r"^scripts/test\.sh: exit 0, ")
        self.assertIn("100% tests passed out of 84", read(os.path.join(self.work, "results", "newcomer_wait", "test.log")))

    def test_failures(self):
        rc, out, _ = self.session("newcomer_test_start")  # no copy yet
        self.assertEqual(rc, 1)
        self.assertIn("no fresh copy in", out)
        rc, out, _ = self.session("newcomer_wait", extra=("--set", "newcomer_wait.wait=0"))
        self.assertEqual(rc, 1)
        self.assertIn("nothing started", out)
        write(os.path.join(self.tree, "scripts", "course.sh"), "#!/bin/sh\necho 'a.cu: error: no'\nexit 3\n", executable=True)
        rc, out, _ = self.session("newcomer")
        self.assertEqual(rc, 1)
        self.assertIn("FAIL  newcomer: bash bench/newcomer.sh run ... exit 3", out)
        record = read(os.path.join(self.work, "results", "newcomer", "newcomer.txt"))
        self.assertRegex(record, r"(?m)^scripts/course\.sh: exit 3, \d+ s; compiler warnings in its build: 0$")
        self.assertIn("a.cu: error: no", record)


if __name__ == "__main__":
    unittest.main()
