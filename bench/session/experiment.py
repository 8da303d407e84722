"""The records a session is made of: an Experiment (what to build, what to run, its parameters with
visible defaults, what it writes, what its summary reports) and the Commands it runs.

Why records and not shell functions: a table can be listed, checked and dry-run without a GPU
(test_session.py), and each experiment has one place, in its stage's module (STYLE.md habit 16,
issue 49). Parameters are typed by their defaults, so `--set road11.sizes=4096` is checked before
anything runs, and a wrong value is refused with what is allowed.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shlex
from typing import Callable

# The targets of an experiment that needs the whole build (the CTest suite covers every target).
ALL_TARGETS = ("all",)

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class Glob:
    """An argument the shell expands when the command runs, not when it is written: the files that
    the commands before it wrote (docs/make_timeline.py reads every step's record of a shape)."""
    pattern: str

    def __str__(self):
        return self.pattern


@dataclasses.dataclass(frozen=True)
class Command:
    """One program run: argv (str or Glob items), extra environment, where its stdout and stderr go
    (None: the experiment's log in WORK/logs, appended), lines written before its output, and the
    exit codes that are not a failure (wgmma_ceiling's 77: no Hopper GPU). filter, a function of the
    output's lines returning the lines to keep, stands for a shell pipe (`2>&1 | strip_bench >`);
    stderr, a file that stderr is appended to apart from stdout (`2>> LOG`)."""
    argv: tuple
    env: dict = dataclasses.field(default_factory=dict)
    stdout: str | None = None
    append: bool = False
    header: tuple = ()
    ok: tuple = (0,)
    filter: Callable | None = None
    stderr: str | None = None

    def shell(self, log: str) -> str:
        """The command as a shell line, as it would run: environment, argv, redirection."""
        words = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        words += [shlex.quote(str(a)) if not isinstance(a, Glob) else a.pattern for a in self.argv]
        out = self.stdout or log
        redirect = ">>" if (self.append or self.stdout is None) else ">"
        if self.filter:
            line = " ".join(words) + f" 2>&1 | {self.filter.__name__} {redirect} {shlex.quote(out)}"
        elif self.stderr:
            line = " ".join(words) + f" {redirect} {shlex.quote(out)} 2>> {shlex.quote(self.stderr)}"
        else:
            line = " ".join(words) + f" {redirect} {shlex.quote(out)} 2>&1"
        if self.header:
            line = f"# first into {out}: " + " / ".join(self.header) + "\n" + line
        return line


@dataclasses.dataclass(frozen=True)
class Where:
    """What a summary function reads: the experiment's results folder, its log, its parameters."""
    results: str
    log: str
    params: dict


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One experiment of one stage. commands(params, ctx) gives its Commands (ctx: runner.Context,
    which knows the build and results folders); outputs are relative to the experiment's results
    folder ({x} marks a part set by a parameter); summary is an output file whose lines go to the
    summary, or a function of a Where returning lines (its docstring says what it reports)."""
    name: str
    stage: str
    description: str
    targets: tuple
    params: dict
    param_help: dict
    commands: Callable
    outputs: tuple
    summary: str | Callable
    check: Callable | None = None  # params -> None, raises ValueError on a bad combination
    finish: Callable | None = None  # (params, ctx, where) -> None: records derived after the commands

    def summary_text(self) -> str:
        """What the summary reports, in one line, for `list`."""
        if isinstance(self.summary, str):
            return f"the lines of {self.summary}"
        return first_line(self.summary.__doc__)


def first_line(doc: str | None) -> str:
    """The first sentence-line of a docstring (empty when there is none)."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def format_value(value) -> str:
    """A parameter's value as `--set` takes it and `list` shows it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(format_value(v) for v in value)
    return str(value)


def _kind(default, plural=False) -> str:
    """The type a default asks for, in words (for the message that refuses a value)."""
    if isinstance(default, tuple):
        return "a comma-separated list of " + _kind(default[0] if default else "", plural=True)
    one, many = {bool: ("a boolean (true/false, yes/no)", "booleans"), int: ("an integer", "integers"),
                 float: ("a number", "numbers")}.get(type(default), ("a word without spaces", "words without spaces"))
    return many if plural else one


def _scalar(default, text: str):
    if isinstance(default, bool):
        low = text.lower()
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        raise ValueError
    if isinstance(default, (int, float)):
        return type(default)(text)
    if not text or re.search(r"\s", text):
        raise ValueError
    return text


def parse_value(default, text: str):
    """text as the type of default; ValueError names what is allowed."""
    try:
        if isinstance(default, tuple):
            items = [t for t in text.split(",")]
            if not items or any(not t for t in items):
                raise ValueError
            elem = default[0] if default else ""
            return tuple(_scalar(elem, t) for t in items)
        return _scalar(default, text)
    except ValueError:
        raise ValueError(f"'{text}' is not {_kind(default)} (default {format_value(default)})") from None


def resolve_params(exp: Experiment, sets: dict) -> dict:
    """The experiment's parameters: its defaults with the `--set` values (name -> text) applied.
    ValueError names the parameter and what is allowed."""
    params = dict(exp.params)
    for name, text in sets.items():
        if name not in exp.params:
            allowed = ", ".join(sorted(exp.params)) or "none"
            raise ValueError(f"{exp.name} has no parameter '{name}' (its parameters: {allowed})")
        try:
            params[name] = parse_value(exp.params[name], text)
        except ValueError as e:
            raise ValueError(f"{exp.name}.{name}: {e}") from None
    if exp.check:
        try:
            exp.check(params)
        except ValueError as e:
            raise ValueError(f"{exp.name}: {e}") from None
    return params


# Small readers for summary functions: the lines of a file, those matching a pattern, its tail.

def file_lines(path: str) -> list:
    """The lines of path, none when it is missing."""
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return []


def grep(path: str, pattern: str, limit: int | None = None) -> list:
    """The lines of path that match pattern (a regular expression over a log, as grep -E)."""
    found = [line for line in file_lines(path) if re.search(pattern, line)]
    return found[:limit] if limit else found


def tail(path: str, n: int) -> list:
    return file_lines(path)[-n:] if n else []


def in_results(where: Where, *parts: str) -> str:
    return os.path.join(where.results, *parts)


def entries_match(param: str, pattern: str, what: str) -> Callable[[dict], None]:
    """A parameter check: every entry of the list parameter `param` matches `pattern` whole, or
    ValueError names the ones that do not and says what is allowed (`what`)."""
    def check(p: dict) -> None:
        bad = [e for e in p[param] if not re.fullmatch(pattern, e)]
        if bad:
            raise ValueError(f"{param} are {what}, not {','.join(bad)}")
    return check
