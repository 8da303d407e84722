"""Running a session: the folders, the build of the experiments' targets, each experiment's
commands with their timing, the summary, and the packing of logs and results into $OUT.

Why it packs in a background thread as well as after each experiment: a device call cut short by
its time limit must still return what the experiment it was in had written so far.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import time

from .experiment import Command, Glob, Where, file_lines, tail

# cmake's options for a session's build: Hopper only, no docs, warnings as errors (CI's rule), and
# no emulated tests (the kernels on the CPU: CI's and scripts/test.sh's business; registered but
# not among an experiment's targets, ctest would count them as failures).
CMAKE_FLAGS = ("-DCMAKE_CUDA_ARCHITECTURES=90", "-DFA_BUILD_DOCS=OFF", "-DFA_EMULATED_TESTS=OFF")
DEPS = "/tmp/deps"


class SessionError(Exception):
    """An experiment that cannot form its commands (a --help it reads did not say): it fails alone."""


class Context:
    """The folders of one call and what the experiments ask of the machine (an executable's path,
    its --help, the GPU's name, the metrics this ncu knows). In a dry run nothing is run or written:
    the answers that need the machine are placeholders."""

    def __init__(self, work, build, out, dry_run=False):
        self.work, self.build, self.out, self.dry_run = work, build, out, dry_run
        self.logs = os.path.join(work, "logs")
        self.summary_path = os.path.join(self.logs, "summary.txt")
        self.produced = set()  # outputs the experiments before this one write (dry run: would write)

    def results(self, name: str) -> str:
        return os.path.join(self.work, "results", name)

    def log(self, name: str) -> str:
        return os.path.join(self.logs, name + ".log")

    def exe(self, path: str) -> str:
        """An executable of the build folder, by its path there (bench/bench_gpu)."""
        return os.path.join(self.build, path)

    def has_output(self, path: str) -> bool:
        """Whether path is there to read: written by an experiment earlier in this call (in a dry run:
        one that would write it), or by an earlier call on this machine (WORK is kept)."""
        if path in self.produced:
            return True
        return not self.dry_run and os.path.isfile(path) and os.path.getsize(path) > 0

    def help_text(self, exe: str) -> str | None:
        """exe --help (None when it cannot run: not built, or a dry run)."""
        if self.dry_run or not os.access(exe, os.X_OK):
            return None
        done = subprocess.run([exe, "--help"], capture_output=True, text=True)
        return done.stdout

    def gpu_name(self) -> str:
        if self.dry_run:
            return "<gpu>"
        done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True) if shutil.which("nvidia-smi") else None
        return done.stdout.splitlines()[0] if done and done.stdout else ""

    def date(self) -> str:
        return "<date>" if self.dry_run else time.strftime("%Y-%m-%d", time.gmtime())

    def known_metrics(self, metrics, log: str) -> str:
        """The metrics of the list this ncu knows on this GPU (by base name), comma-separated; the
        others are named in log. All of them when ncu cannot list its metrics, or in a dry run."""
        if self.dry_run:
            return ",".join(metrics)
        known = self._ncu_metrics()
        out = []
        with open(log, "a") as f:
            for m in metrics:
                if not known or m.split(".")[0] in known:
                    out.append(m)
                else:
                    f.write(f"ncu here does not know {m.split('.')[0]}: left out\n")
        return ",".join(out)

    def known_sections(self, sections, log: str) -> list:
        """--section X for each section this ncu has (by identifier); the others are named in log.
        All of them when ncu cannot list its sections, or in a dry run."""
        known = set() if self.dry_run else self._ncu_list("ncu_sections.txt", "--list-sections")
        out = []
        for s in sections:
            if not known or s in known:
                out += ["--section", s]
            else:
                with open(log, "a") as f:
                    f.write(f"ncu here has no section {s}: left out\n")
        return out

    def _ncu_list(self, name: str, option: str) -> set:
        """The first words of `ncu OPTION`'s lines, kept in WORK/NAME between calls."""
        cache = os.path.join(self.work, name)
        if not os.path.isfile(cache):
            done = subprocess.run(["ncu", option], capture_output=True, text=True) if shutil.which("ncu") else None
            names = [line.split()[0] for line in (done.stdout if done else "").splitlines() if line.split()]
            with open(cache, "w") as f:
                f.write("".join(n + "\n" for n in names))
        return set(file_lines(cache))

    def _ncu_metrics(self) -> set:
        cache = os.path.join(self.work, "ncu_metrics.txt")
        if not os.path.isfile(cache):
            done = subprocess.run(["ncu", "--query-metrics"], capture_output=True, text=True) \
                if shutil.which("ncu") else None
            names = [line.split()[0] for line in (done.stdout if done else "").splitlines() if line.split()]
            with open(cache, "w") as f:
                f.write("".join(n + "\n" for n in names))
        return set(file_lines(cache))


class Session:
    """One call: records to stdout and the summary, runs commands, keeps the status (0 ok, 1 a
    failure) and packs. In a dry run it prints each command instead of running it."""

    def __init__(self, ctx: Context, pack_every: float):
        self.ctx, self.pack_every, self.status = ctx, pack_every, 0
        self.start = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def record(self, *lines: str):
        """Lines to stdout and, unless a dry run, to the summary."""
        for line in lines:
            print(line, flush=True)
        if not self.ctx.dry_run:
            with open(self.ctx.summary_path, "a") as f:
                f.write("".join(line + "\n" for line in lines))

    def note(self, text: str):
        self.record("", f"===== {text} =====")

    def timed(self, name: str, t0: float):
        if self.ctx.dry_run:
            return
        now = time.monotonic()
        self.record(f"[{name}: {now - t0:.0f} s, {now - self.start:.0f} s since the start]")

    def run(self, cmd: Command, log: str) -> int:
        """Runs cmd (stdout and stderr into its file), or prints it in a dry run; its exit code."""
        if self.ctx.dry_run:
            print(cmd.shell(log), flush=True)
            return 0
        argv = expand(cmd.argv)
        path = cmd.stdout or log
        with open(path, "a" if (cmd.append or cmd.stdout is None) else "w") as f:
            f.write("".join(line + "\n" for line in cmd.header))
            f.flush()
            try:
                if cmd.filter:  # a pipe: the output read whole, the kept lines written
                    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          env={**os.environ, **cmd.env})
                    lines = done.stdout.decode(errors="replace").splitlines()
                    f.write("".join(line + "\n" for line in cmd.filter(lines)))
                    return done.returncode
                if cmd.stderr:
                    with open(cmd.stderr, "a") as err:
                        return subprocess.run(argv, stdout=f, stderr=err, env={**os.environ, **cmd.env}).returncode
                done = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **cmd.env})
                return done.returncode
            except OSError as e:  # not built, not installed
                f.write(f"{argv[0]}: {e}\n")
                return 127

    def failed(self, name: str, cmd: Command, rc: int, log: str):
        """A command's failure in the summary: which, its exit code, the end of what it printed."""
        path = cmd.stdout or log
        self.status = 1
        self.record(f"FAIL  {name}: {os.path.basename(str(cmd.argv[0]))} "
                    f"{' '.join(str(a) for a in cmd.argv[1:3])} ... exit {rc} (see {os.path.basename(path)})")
        self.record(*("  " + line for line in tail(path, 20)))

    # Packing -------------------------------------------------------------------------------------

    def pack(self):
        """WORK's logs and results into $OUT/session.tgz, and the summary beside it; each write goes
        to a part file first, so a reader never sees half an archive."""
        if self.ctx.dry_run:
            return
        with self._lock:
            part = os.path.join(self.ctx.out, f"session.tgz.part.{os.getpid()}")
            try:
                with tarfile.open(part, "w:gz") as tar:
                    for sub in ("logs", "results"):
                        path = os.path.join(self.ctx.work, sub)
                        if os.path.isdir(path):
                            tar.add(path, arcname=sub)
                os.replace(part, os.path.join(self.ctx.out, "session.tgz"))
            except OSError as e:  # a file that shrank or vanished under tar: the next pack takes it
                print(f"pack: {e}; the previous session.tgz stays", file=sys.stderr)
                if os.path.exists(part):
                    os.remove(part)
            if os.path.isfile(self.ctx.summary_path):
                copy = os.path.join(self.ctx.out, "summary.txt.part")
                shutil.copyfile(self.ctx.summary_path, copy)
                os.replace(copy, os.path.join(self.ctx.out, "summary.txt"))

    def start_packer(self):
        """Packs every pack_every seconds in a daemon thread until stop_packer()."""
        if self.ctx.dry_run:
            print(f"# packs {self.ctx.work}/logs and results into {self.ctx.out}/session.tgz every "
                  f"{self.pack_every:g} s and after each experiment")
            return

        def loop():
            while not self._stop.wait(self.pack_every):
                self.pack()
        threading.Thread(target=loop, daemon=True).start()

    def stop_packer(self):
        self._stop.set()


def expand(argv) -> list:
    """argv with each Glob expanded as the shell does (sorted; the pattern itself when nothing
    matches)."""
    out = []
    for a in argv:
        if isinstance(a, Glob):
            out += sorted(glob.glob(a.pattern)) or [a.pattern]
        else:
            out.append(str(a))
    return out


def deps_commands() -> list:
    """Debian's header-only packages of .deps/ (Eigen, CLI11, doctest, nlohmann-json) unpacked once
    into /tmp/deps: the device machine has no package access."""
    debs = sorted(glob.glob(".deps/*.deb"))
    if not debs or os.path.isdir(os.path.join(DEPS, "usr")):
        return []
    return [Command(("mkdir", "-p", DEPS))] + [Command(("dpkg", "-x", d, DEPS)) for d in debs]


def configure_command(ctx: Context, tuning: str, deps_coming: bool) -> Command:
    """cmake's configure of the session's build (stage 07's tuning candidates on unless --tuning
    OFF: the road experiment times them)."""
    prefix = [f"-DCMAKE_PREFIX_PATH={DEPS}/usr"] if deps_coming or os.path.isdir(DEPS + "/usr") else []
    argv = ("cmake", "-S", ".", "-B", ctx.build, "-G", "Ninja", *prefix, *CMAKE_FLAGS,
            f"-DFA_STAGE07_TUNING={tuning}", "-DFA_WERROR=ON")
    return Command(argv, stdout=ctx.log("configure"))


def ninja_command(ctx: Context, targets) -> Command:
    """ninja on the targets (none: everything), going on past a failing one (-k 0)."""
    return Command(("ninja", "-C", ctx.build, "-j16", "-k", "0", *targets), stdout=ctx.log("build"))


def build(session: Session, targets, tuning: str) -> bool:
    """Unpacks the packages, configures and builds targets ("all" among them: everything). False
    when configure failed: nothing can run then."""
    ctx = session.ctx
    t0 = time.monotonic()
    names = [] if "all" in targets else sorted(targets)
    session.note(f"build: {' '.join(names) or 'all targets'}")
    deps = deps_commands()
    for cmd in deps:
        session.run(cmd, ctx.log("deps"))
    if session.run(configure_command(ctx, tuning, bool(deps)), "") != 0:
        session.status = 1
        session.record("configure FAILED", *tail(ctx.log("configure"), 30))
        return False
    if session.run(ninja_command(ctx, names), "") != 0:
        session.status = 1
        session.record("build FAILED (some targets)", *first_errors(ctx.log("build")))
    serialized_check(session)
    wgmma_sass_check(session, targets)
    if not ctx.dry_run:
        session.record(f"build ok ({' '.join(names) or 'all targets'}; stage 07 tuning candidates {tuning})")
    session.timed("build", t0)
    session.pack()
    return True


def first_errors(path: str, count: int = 3) -> list:
    """The first errors of a build log, each with two lines before and twelve after (grep -B2 -A12)."""
    lines, out = file_lines(path), []
    hits = [i for i, line in enumerate(lines) if "error" in line][:count]
    for i in hits:
        out += lines[max(0, i - 2):i + 13]
    return out


def serialized_check(session: Session):
    """ptxas serializing a wgmma pipeline says so only in an info line of the build log (C7514,
    C7515, C7518, C7520): the build fails the session then. The tests' own kernels (namespace
    fa::test, mangled _ZN2fa4test) are left out: each checks one instruction's result, not speed."""
    if session.ctx.dry_run:
        return
    key = "wgmma.mma_async instructions are serialized"
    hits = [line for line in file_lines(session.ctx.log("build")) if key in line and "_ZN2fa4test" not in line]
    if hits:
        session.status = 1
        counts = {}
        for line in hits:
            short = "  (C75" + line.split("(C75", 1)[1] if "(C75" in line else line
            counts[short] = counts.get(short, 0) + 1
        session.record("FAIL  ptxas serialized a wgmma pipeline:",
                       *(f"{n:7d} {text}" for text, n in sorted(counts.items())[:8]))


# The executables that hold stage 11's kernels, whose SASS wgmma_sass_check() reads when the call
# builds them: target -> (path in the build folder, the table of its kernel instances in WORK/logs).
STAGE11_EXE = "stages/11_hopper_kernel/stage11_hopper_kernel"
WGMMA_EXES = {"stage11_hopper_kernel": (STAGE11_EXE, "wgmma_sass.txt"),
              "bench_gpu": ("bench/bench_gpu", "wgmma_sass_bench_gpu.txt")}


def sass_counts(sass_lines) -> list:
    """Per kernel instance of `cuobjdump -sass`: [name, uniform-datapath instructions (U*), R2UR,
    spills (STL, LDL), instructions, HGMMA, HGMMA with gsb0, WARPGROUP.DEPBAR]."""
    rows, row = [], None
    for line in sass_lines:
        if "Function :" in line:
            row = [line.split("Function :", 1)[1].strip()] + [0] * 7
            rows.append(row)
            continue
        if row is None:
            continue
        op = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[0-9T] +)?([^ .;]+)", line)
        if op:
            row[4] += 1
            row[1] += op.group(1).startswith("U")
            row[2] += op.group(1) == "R2UR"
            row[3] += op.group(1) in ("STL", "LDL")
        if "HGMMA" in line:
            row[5] += 1
            row[6] += "gsb0" in line
        row[7] += "WARPGROUP.DEPBAR" in line
    return rows


def demangle(names) -> list:
    """The names as c++filt prints them (unchanged without it)."""
    if not names or not shutil.which("c++filt"):
        return list(names)
    done = subprocess.run(["c++filt"], input="\n".join(names) + "\n", capture_output=True, text=True)
    out = done.stdout.splitlines()
    return out if len(out) == len(names) else list(names)


def sass_check(exe: str, table: str) -> tuple:
    """ptxas can serialize a wgmma pipeline with no more than an info line in the build log, or
    none (it then waits after every wgmma): in SASS, `gsb0` on every HGMMA, where a pipelined kernel
    has one per wgmma group. Each instance's counts of exe go to table (name, then sass_counts()'s
    numbers; fewer uniform instructions and more R2UR show ring counters and descriptors moved out of
    the uniform datapath, as in stage 11's step 16). (summary lines, the serialized instances: more
    than two HGMMA, every one with gsb0)."""
    if not os.access(exe, os.X_OK) or not shutil.which("cuobjdump"):
        return [], []
    with subprocess.Popen(["cuobjdump", "-sass", exe], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True, errors="replace") as dump:  # read as it comes: bench_gpu's is large
        rows = sass_counts(dump.stdout)
    lines = [" ".join([name] + [str(v) for v in row[1:]]) for name, row in zip(demangle([r[0] for r in rows]), rows)]
    with open(table, "w") as f:
        f.write("".join(line + "\n" for line in lines))
    serialized = [line for line, row in zip(lines, rows) if row[5] > 2 and row[5] == row[6]]
    summary = [f"{os.path.basename(exe)} SASS: {len(rows)} kernel instances; {len(serialized)} with every HGMMA waited "
               f"for (a serialized wgmma pipeline); uniform instructions, R2UR, spills per instance in "
               f"{os.path.basename(table)}"]
    return summary + ["  serialized: " + line for line in serialized[:8]], serialized


def wgmma_sass_check(session: Session, targets):
    """sass_check() of each executable of WGMMA_EXES among targets ("all": both) into its table in
    WORK/logs: a serialized instance fails the session."""
    ctx = session.ctx
    for target, (path, table) in WGMMA_EXES.items():
        if "all" not in targets and target not in targets:
            continue
        if ctx.dry_run:
            print(f"# then, in Python: cuobjdump -sass {ctx.exe(path)}: every HGMMA with gsb0 (a serialized wgmma "
                  f"pipeline) fails the session; counts in {ctx.logs}/{table}")
            continue
        lines, serialized = sass_check(ctx.exe(path), os.path.join(ctx.logs, table))
        session.record(*lines)
        if serialized:
            session.status = 1


def prepare(ctx: Context):
    """The folders of a call. WORK is kept between calls on one machine (two calls in one device
    call keep both results); an experiment's own folder and log start empty."""
    for path in (ctx.logs, os.path.join(ctx.work, "results"), ctx.out):
        os.makedirs(path, exist_ok=True)


def run_experiment(session: Session, exp, params: dict):
    """One experiment: a fresh results folder and log, its commands in order (a failing one is
    recorded and the rest still run), its finishing step, its summary, its time, a pack."""
    ctx, t0 = session.ctx, time.monotonic()
    results, log = ctx.results(exp.name), ctx.log(exp.name)
    session.note(f"{exp.name} (stage {exp.stage}): {exp.description}")
    if not ctx.dry_run:
        shutil.rmtree(results, ignore_errors=True)
        os.makedirs(results)
        open(log, "w").close()
    else:
        print(f"# results in {results}, log {log}")
    where = Where(results, log, params)
    try:
        for cmd in exp.commands(params, ctx):
            rc = session.run(cmd, log)
            if rc not in cmd.ok:
                session.failed(exp.name, cmd, rc, log)
        if exp.finish:
            finish(session, exp, params, where)
    except SessionError as e:
        session.status = 1
        session.record(f"FAIL  {exp.name}: {e}")
    ctx.produced.update(os.path.join(results, o) for o in exp.outputs)
    if not ctx.dry_run:
        session.record(*summary_lines(exp, where))
        session.timed(exp.name, t0)
        session.pack()


def finish(session: Session, exp, params: dict, where: Where):
    """The experiment's finishing step (records derived from its outputs), or its name in a dry run."""
    if session.ctx.dry_run:
        print(f"# then, in Python: {exp.name}: {' '.join((exp.finish.__doc__ or '').split()[:20])} ...")
        return
    exp.finish(params, session.ctx, where)


def summary_lines(exp, where: Where) -> list:
    if isinstance(exp.summary, str):
        return file_lines(os.path.join(where.results, exp.summary))
    return list(exp.summary(where))


def run_all(ctx: Context, planned, tuning: str, do_build: bool, pack_every: float) -> int:
    """The call: folders, packer, build of the union of the targets, each experiment, the end."""
    session = Session(ctx, pack_every)
    if not ctx.dry_run:
        prepare(ctx)
    session.note(f"session: {' '.join(exp.name for exp, _ in planned)} "
                 f"(work {ctx.work}, build {ctx.build}, out {ctx.out})")
    session.start_packer()
    targets = sorted({t for exp, _ in planned for t in exp.targets})
    try:
        if do_build and targets and not build(session, targets, tuning):
            return finish_call(session)
        for exp, params in planned:
            run_experiment(session, exp, params)
    finally:
        session.stop_packer()
    return finish_call(session)


def finish_call(session: Session) -> int:
    session.note(f"done, status {session.status}, {time.monotonic() - session.start:.0f} s")
    session.pack()
    sys.stdout.flush()
    return session.status
