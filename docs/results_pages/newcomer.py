"""A reader's first run on the GPU machine (`python3 bench/session.py run newcomer newcomer_test`):
newcomer.txt and newcomer_test.txt hold the machine, the compilers, the date and every verdict, and
the results page shows them as they were written; nothing in them is read as numbers."""

import os

from .page import verbatim_file

RECORDS = ("newcomer.txt", "newcomer_test.txt")


def records(results_dir):
    """The newcomer records that are there, in RECORDS' order; [] without newcomer.txt (the test
    run's record alone does not make the section)."""
    paths = [os.path.join(results_dir, name) for name in RECORDS]
    if not os.path.exists(paths[0]):
        return []
    return [p for p in paths if os.path.exists(p)]


def section(results_dir, out):
    """The section with both records as written; False (and nothing written) without them."""
    paths = records(results_dir)
    if not paths:
        return False
    out.append("## A reader's first run on the GPU machine {#results_newcomer}")
    out.append("")
    out.append("A fresh copy of the course on the GPU machine, then the README's two commands unchanged "
               "(`python3 bench/session.py run newcomer newcomer_test`). The machine reaches no package "
               "registry, so Eigen, CLI11 and doctest come from Debian's `.deb` files and the docs, "
               "which need Doxygen, are left out there.")
    out.append("")
    for path in paths:
        verbatim_file(path, out)
    return True
