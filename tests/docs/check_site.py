#!/usr/bin/env python3
"""Checks the built lesson site the way a reader sees it.

Static checks (always):
  - the tree view lists the main page, then the stage lessons in course order, then the results;
  - MathJax is served from html/mathjax (the site works offline) and nothing loads from the network;
  - every local link, image and object on the checked pages points to a file that exists.
Browser checks (headless Chromium; exit 77 = skipped when it is not installed):
  - every formula was typeset by MathJax: as many rendered elements as formulas, no MathJax
    error, and no raw TeX delimiters (\\f$, \\(, \\[) left in the visible text;
  - every \\snippet and \\verbinclude of the lesson's README.md became a code fragment with
    lines in it, and no unprocessed Doxygen command shows in the text;
  - the dark-mode toggle of doxygen-awesome is on the page.

Usage: check_site.py --html build/docs/html --repo . [--pages index.html stage04.html ...]
                     [--screenshots DIR]
Exit codes: 0 pass, 1 a check failed, 77 Chromium is not installed (the browser checks skipped).
"""

import argparse
import glob
import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser

SKIP = 77
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class Page(HTMLParser):
    """Collects what the checks need from one HTML document."""

    HIDDEN = {"script", "style", "pre", "code", "textarea", "noscript"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.text = []            # visible text outside code and scripts
        self.stack = []
        self.links = []           # href / src / data attributes
        self.classes = {}         # class name -> count
        self.math_sources = 0     # <script type="math/tex...">
        self.fragments = []       # per div/pre.fragment: number of div.line or text length
        self.tags = {}            # tag name -> count
        self._fragment_depth = None
        self._fragment_lines = 0
        self._fragment_text = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags[tag] = self.tags.get(tag, 0) + 1
        for cls in (a.get("class") or "").split():
            self.classes[cls] = self.classes.get(cls, 0) + 1
        if tag == "script" and (a.get("type") or "").startswith("math/tex"):
            self.math_sources += 1
        for key in ("href", "src", "data"):
            if a.get(key):
                self.links.append((tag, key, a[key]))
        cls = (a.get("class") or "").split()
        if self._fragment_depth is None and tag in ("div", "pre") and "fragment" in cls:
            self._fragment_depth = len(self.stack)
            self._fragment_lines = 0
            self._fragment_text = 0
        elif self._fragment_depth is not None and tag == "div" and "line" in cls:
            self._fragment_lines += 1
        if tag not in ("br", "img", "meta", "link", "input", "hr", "col", "area", "base", "wbr", "source"):
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in self.stack:
            while self.stack:
                top = self.stack.pop()
                if top == tag:
                    break
        if self._fragment_depth is not None and len(self.stack) <= self._fragment_depth:
            self.fragments.append((self._fragment_lines, self._fragment_text))
            self._fragment_depth = None

    def handle_data(self, data):
        if self._fragment_depth is not None:
            self._fragment_text += len(data.strip())
        if not any(t in self.HIDDEN for t in self.stack):
            self.text.append(data)


def parse(text):
    p = Page()
    p.feed(text)
    p.close()
    p.visible = " ".join(p.text)
    return p


def find_browser():
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def run_browser(browser, url, profile, extra):
    cmd = [browser, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
           "--virtual-time-budget=10000", f"--user-data-dir={profile}"] + extra + [url]
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=120, text=True)


class Checker:
    def __init__(self, html_dir, repo):
        self.html = os.path.abspath(html_dir)
        self.repo = os.path.abspath(repo)
        self.failures = []
        self.lessons = self.find_lessons()

    def fail(self, page, message):
        self.failures.append(f"{page}: {message}")

    def find_lessons(self):
        """{page name: Markdown path} for every stage lesson and record page in the repository."""
        lessons = {}
        pages = glob.glob(os.path.join(self.repo, "stages", "*", "README.md"))
        pages += glob.glob(os.path.join(self.repo, "stages", "*", "RECORD.md"))
        for page in sorted(pages):
            with open(page, encoding="utf-8") as f:
                first = f.readline()
            m = re.search(r"\{#(stage\d+(?:_record)?)\}", first)
            if m:
                lessons[m.group(1) + ".html"] = page
        return lessons

    # ------------------------------------------------------------------ static checks
    def check_tree(self):
        path = os.path.join(self.html, "navtreedata.js")
        if not os.path.exists(path):
            self.fail("navtreedata.js", "missing: is GENERATE_TREEVIEW on?")
            return
        with open(path, encoding="utf-8") as f:
            tree = f.read()
        # Top-level entries of the tree, in order: [ "title", "file.html", ...
        entries = re.findall(r'^\s{4}\[ "([^"]*)", "([^"#]*)', tree, flags=re.M)
        files = [f for _, f in entries]
        stages = [f for f in files if re.fullmatch(r"stage\d+(?:_record)?\.html", f)]  # a lesson, then its record
        if not files or files[0] != "index.html":
            self.fail("tree view", f"the main page should come first, found {files[:3]}")
        if stages != sorted(stages):
            self.fail("tree view", f"stage pages are not in course order: {stages}")
        missing = [p for p in self.lessons if p not in stages]
        if missing:
            self.fail("tree view", f"lessons missing from the tree: {missing}")
        if "results.html" in files and stages and files.index("results.html") < files.index(stages[-1]):
            self.fail("tree view", "the results page should come after the stages")

    def check_offline(self, name, text):
        if not os.path.exists(os.path.join(self.html, "mathjax", "MathJax.js")):
            self.fail(name, "html/mathjax/MathJax.js is missing: MathJax would need the network")
        for m in re.finditer(r'<(script|link|img)\b[^>]*\b(?:src|href)="(https?:)?//[^"]*"', text):
            self.fail(name, f"loads from the network: {m.group(0)[:120]}")
        if "mathjax/MathJax.js" not in text and ("\\(" in text or "\\[" in text):
            self.fail(name, "has formulas but does not load mathjax/MathJax.js")

    def check_links(self, name, page):
        for tag, key, target in page.links:
            if re.match(r"^(https?:|mailto:|javascript:|#|data:)", target):
                continue
            local = html.unescape(target.split("#")[0].split("?")[0])
            if not local:
                continue
            if not os.path.exists(os.path.join(self.html, local)):
                self.fail(name, f"<{tag} {key}=\"{target}\"> points to a missing file")

    # ------------------------------------------------------------------ browser checks
    def check_rendered(self, name, static_text, dom_text):
        static = parse(static_text)
        dom = parse(dom_text)
        # Formulas: Doxygen writes \( ... \) and \[ ... \] (or \begin{...}); MathJax replaces each
        # with a rendered element and keeps the source in <script type="math/tex">.
        # Environments (\f{align}{...\f}) come without \[ ... \]; those inside \[ ... \] are one formula.
        outside = re.sub(r"\\\[.*?\\\]", " ", static.visible, flags=re.S)
        expected = len(re.findall(r"\\\(", static.visible)) + len(re.findall(r"\\\[", static.visible)) \
            + len(re.findall(r"\\begin\{", outside))
        rendered = dom.classes.get("MathJax", 0)  # display math is a .MathJax inside .MathJax_Display
        self.summary = f"{rendered} of {expected} formulas typeset, {len(dom.fragments)} code fragments"
        if rendered < expected:
            self.fail(name, f"{expected} formulas in the page but only {rendered} typeset by MathJax")
        if dom.math_sources < expected:
            self.fail(name, f"{expected} formulas but MathJax picked up {dom.math_sources}")
        for leftover in ("\\f$", "\\f[", "\\f]", "\\(", "\\)", "\\[", "\\]"):
            if leftover in dom.visible:
                i = dom.visible.index(leftover)
                self.fail(name, f"raw TeX left in the text: ...{dom.visible[max(0, i - 40):i + 40]!r}...")
                break
        for bad in ("Math Processing Error", "MathJax no longer loads", "could not find"):
            if bad in dom.visible:
                self.fail(name, f"MathJax reported: {bad!r}")
        if dom.classes.get("merror") or dom.classes.get("MathJax_Error"):
            self.fail(name, "MathJax marked a formula as an error (red text)")

        # Snippets and included outputs of a lesson.
        readme = self.lessons.get(name)
        if readme:
            with open(readme, encoding="utf-8") as f:
                source = f.read()
            # Commands in the lesson's text, not inside code spans or fenced code.
            prose = re.sub(r"(~~~|```).*?\1", "", source, flags=re.S)
            prose = re.sub(r"`[^`\n]*`", "", prose)
            snippets = len(re.findall(r"[\\@]snippet(?:lineno|doc|\{[^}]*\})?\s", prose))
            verbincludes = len(re.findall(r"[\\@]verbinclude\s", prose))
            needed = snippets + verbincludes
            if len(dom.fragments) < needed:
                self.fail(name, f"{snippets} \\snippet and {verbincludes} \\verbinclude in {os.path.relpath(readme, self.repo)} "
                                f"but only {len(dom.fragments)} code fragments on the page")
            empty = [i for i, (lines, chars) in enumerate(dom.fragments) if lines == 0 and chars == 0]
            if empty:
                self.fail(name, f"{len(empty)} empty code fragment(s): a snippet tag or file not found?")
        for raw in ("\\snippet", "@snippet", "\\verbinclude", "\\ref ", "\\image", "\\f$"):
            if raw in dom.visible:
                self.fail(name, f"unprocessed Doxygen command {raw!r} in the text")
        if re.search(r"snippet[^.]{0,40}not found|unable to (open|find)", dom.visible, flags=re.I):
            self.fail(name, "a 'not found' message in the text")
        if "doxygen-awesome-dark-mode-toggle" not in dom_text:
            self.fail(name, "no dark-mode toggle (doxygen-awesome-darkmode-toggle.js not loaded?)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--html", required=True, help="the site's html folder (build/docs/html)")
    ap.add_argument("--repo", required=True, help="repository root, to read the lessons' README.md")
    ap.add_argument("--pages", nargs="*", help="pages to open (default: index, every lesson, results)")
    ap.add_argument("--screenshots", help="also save a screenshot of each page into this folder")
    args = ap.parse_args()

    c = Checker(args.html, args.repo)
    if not os.path.exists(os.path.join(c.html, "index.html")):
        print(f"FAIL: {c.html}/index.html does not exist: build the docs first (cmake --build build --target docs)")
        return 1
    pages = args.pages or (["index.html"] + list(c.lessons) + ["results.html"])
    pages = [p for p in pages if os.path.exists(os.path.join(c.html, p)) or c.fail(p, "page does not exist")]

    c.check_tree()
    statics = {}
    for p in pages:
        with open(os.path.join(c.html, p), encoding="utf-8") as f:
            statics[p] = f.read()
        c.check_offline(p, statics[p])
        c.check_links(p, parse(statics[p]))

    browser = find_browser()
    if browser is None:
        for f in c.failures:
            print(f"FAIL: {f}")
        if c.failures:
            return 1
        print("SKIP: no Chromium found (sudo apt-get install chromium); static checks passed, "
              "the pages were not rendered")
        return SKIP

    with tempfile.TemporaryDirectory(prefix="fa-docs-chromium-") as profile:
        for p in pages:
            url = "file://" + os.path.join(c.html, p)
            result = run_browser(browser, url, profile, ["--dump-dom"])
            if result.returncode != 0 or not result.stdout.strip():
                c.fail(p, f"{os.path.basename(browser)} could not render it (exit {result.returncode})")
                continue
            c.check_rendered(p, statics[p], result.stdout)
            print(f"checked {p}: {c.summary}", flush=True)
            if args.screenshots:
                os.makedirs(args.screenshots, exist_ok=True)
                shot = os.path.join(os.path.abspath(args.screenshots), p.replace(".html", ".png"))
                run_browser(browser, url, profile, ["--window-size=1400,1000", f"--screenshot={shot}"])

    for f in c.failures:
        print(f"FAIL: {f}")
    if c.failures:
        return 1
    print(f"PASS: {len(pages)} page(s) rendered with formulas typeset and snippets resolved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
