#!/usr/bin/env python3
"""Launcher of the GPU session driver, bench/session/ (its docstring says how to run a session):

    python3 bench/session.py list
    python3 bench/session.py run EXP [EXP...] [--set EXP.PARAM=VALUE ...] [--dry-run] [--out DIR] [--build DIR]

Python 3 standard library only.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/: the package `session` beside this file

from session.cli import main  # noqa: E402  (the package takes precedence over this file's own name)

if __name__ == "__main__":
    sys.exit(main())
