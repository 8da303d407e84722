#!/usr/bin/env python3
"""Holds the stage pages to their shape, without building the site:

- each lesson (stages/NN_*/README.md) stays under its word cap (`wc -w` of the whole file), so
  that the record of runs does not creep back into the lesson;
- the navigation line under each lesson's title points to the previous and the next stage in
  course order, with the titles those pages carry (the course map's placeholder title for a
  stage not written yet), and stage 01's back to the course map;
- a record page (RECORD.md beside a lesson) is named `stageNN_record`, leads back to its lesson,
  and its lesson links to it;
- a stage's reading files (stages/NN_*/steps/*.cu) stay within 250 lines, their launch included.

    python3 tests/docs/check_lessons.py --repo .

Exits 1 with one line per fault, 0 when every page keeps its shape.
"""
import argparse
import glob
import os
import re
import sys

# Words a lesson may hold (the record of its runs lives on its record page).
WORD_CAPS = {"07": 9000, "09": 8000, "10": 4000, "11": 8000}

TITLE = re.compile(r"^#\s+(.*?)\s*\{#(stage\d\d)\}\s*$")
RECORD_TITLE = re.compile(r"^#\s+(.*?)\s*\{#(stage\d\d)_record\}\s*$")
REF = re.compile(r'\\ref\s+(\w+)\s+"([^"]*)"')
MAP_ENTRY = re.compile(r'\\ref\s+(stage\d\d)\s+"([^"]*)"')


def words(text):
    """What `wc -w` counts: runs of non-whitespace."""
    return len(text.split())


def course_pages(repo):
    """[(number, anchor, title, path or None)] in course order: the lessons, and the stages the
    course map on the main page names without a lesson yet (their placeholder pages)."""
    pages = {}
    for path in sorted(glob.glob(os.path.join(repo, "stages", "[0-9][0-9]_*", "README.md"))):
        with open(path, encoding="utf-8") as f:
            first = f.readline()
        m = TITLE.match(first)
        if m:
            pages[m.group(2)] = (m.group(1), path)
    mainpage = os.path.join(repo, "docs", "mainpage.md")
    if os.path.exists(mainpage):
        with open(mainpage, encoding="utf-8") as f:
            for anchor, title in MAP_ENTRY.findall(f.read()):
                pages.setdefault(anchor, (title, None))
    return [(int(a[5:]), a, t, p) for a, (t, p) in sorted(pages.items())]


def check_caps(repo, faults):
    for number, cap in sorted(WORD_CAPS.items()):
        found = glob.glob(os.path.join(repo, "stages", f"{number}_*", "README.md"))
        if not found:
            faults.append(f"stage {number}: no lesson (stages/{number}_*/README.md) to hold to {cap} words")
            continue
        with open(found[0], encoding="utf-8") as f:
            n = words(f.read())
        if n > cap:
            faults.append(f"{os.path.relpath(found[0], repo)}: {n} words, over the lesson's cap of {cap} "
                          "(move runs, rounds and tries that lost to the stage's RECORD.md)")


def nav_line(lines):
    """The navigation line: the first non-blank line after the title."""
    for line in lines[1:6]:
        if line.strip():
            return line.strip()
    return ""


def check_navigation(repo, faults):
    pages = course_pages(repo)
    for i, (number, anchor, title, path) in enumerate(pages):
        if path is None:
            continue
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        line = nav_line(lines)
        where = os.path.relpath(path, repo)
        if "·" not in line:
            faults.append(f"{where}: no navigation line (← previous · next: ... →) under the title")
            continue
        back, forward = line.split("·", 1)
        want_back = ("index", "the course map") if i == 0 else (pages[i - 1][1], pages[i - 1][2])
        got_back = REF.findall(back)
        if got_back[:1] != [want_back]:
            faults.append(f'{where}: the back link is {got_back[:1] or "missing"}, '
                          f'expected \\ref {want_back[0]} "{want_back[1]}"')
        got_next = REF.findall(forward)
        if i + 1 < len(pages):
            want_next = (pages[i + 1][1], pages[i + 1][2])
            if got_next[:1] != [want_next]:
                faults.append(f'{where}: the next link is {got_next[:1] or "missing"}, '
                              f'expected \\ref {want_next[0]} "{want_next[1]}"')
        elif got_next:
            faults.append(f"{where}: the last stage of the course map links to {got_next[0][0]} as next")


def check_records(repo, faults):
    for record in sorted(glob.glob(os.path.join(repo, "stages", "[0-9][0-9]_*", "RECORD.md"))):
        folder = os.path.dirname(record)
        number = os.path.basename(folder)[:2]
        where = os.path.relpath(record, repo)
        with open(record, encoding="utf-8") as f:
            lines = f.read().splitlines()
        m = RECORD_TITLE.match(lines[0]) if lines else None
        if not m or m.group(2) != f"stage{number}":
            faults.append(f"{where}: the first line should be '# Stage {number} — the record {{#stage{number}_record}}'")
        back = REF.findall(nav_line(lines))
        if not back or back[0][0] != f"stage{number}":
            faults.append(f"{where}: the line under the title should lead back to the lesson (\\ref stage{number} ...)")
        lesson = os.path.join(folder, "README.md")
        if os.path.exists(lesson):
            with open(lesson, encoding="utf-8") as f:
                if f"stage{number}_record" not in f.read():
                    faults.append(f"{os.path.relpath(lesson, repo)}: never links to its record page (stage{number}_record)")


# A reading file (STYLE.md habit 15) is a step on its own, its launch included, short enough to read
# in one sitting: stages/NN_*/steps/*.cu.
READING_FILE_LINES = 250


def check_reading_files(repo, faults):
    for path in sorted(glob.glob(os.path.join(repo, "stages", "[0-9][0-9]_*", "steps", "*.cu"))):
        with open(path, encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > READING_FILE_LINES:
            faults.append(f"{os.path.relpath(path, repo)}: {n} lines, over a reading file's {READING_FILE_LINES}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    args = parser.parse_args(argv)
    faults = []
    check_caps(args.repo, faults)
    check_navigation(args.repo, faults)
    check_records(args.repo, faults)
    check_reading_files(args.repo, faults)
    for fault in faults:
        print(fault)
    print(f"check_lessons: {len(faults)} fault(s)")
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main())
