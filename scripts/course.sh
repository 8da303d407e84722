#!/usr/bin/env bash
# Builds flashcourse and runs the course: every stage in order, each printing its report and
# checking itself against the stage before it. Stages that need a GPU say so in one line and
# are skipped when none is present. Then builds the lessons as a Doxygen site.
#
# The stages are built first and alone (the `stages` target), with the build going on past a
# target that fails: one stage that does not compile costs that stage, never the others, and no
# test source can stop the course (the tests are scripts/test.sh's). Warnings are reported, not
# errors, so that a newer compiler's new warning does not stop a reader.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh || exit 1

cmake --preset default -DFA_WERROR=OFF >/dev/null || { echo "course: the configure step failed (see above)"; exit 1; }
# The stages this configuration defines: "NN_name target path" per line (stages/CMakeLists.txt).
# Their executables are linked anew each time (seconds), so that one left by an earlier build of
# sources that no longer compile is never run as if it were current.
declare -A configured
while read -r name _ path; do configured[$name]=$path; rm -f "$path"; done <build/stages.txt
build_ok=1
cmake --build --preset default --target stages -j "$(nproc)" -- -k 0 || build_ok=0

failed=()
for dir in stages/[0-9][0-9]_*/; do
    name=$(basename "$dir")  # 04_cpu_tiling
    exe=${configured[$name]:-}
    if [[ -z "$exe" ]]; then
        echo
        echo "== stage ${name%%_*}: not built here: its GPU code needs nvcc (the CUDA Toolkit) on PATH =="
        continue
    fi
    if [[ ! -x "$exe" ]]; then
        echo
        echo "== stage ${name%%_*}: NOT BUILT: its code, or an earlier stage it checks itself against, failed to compile (errors above) =="
        failed+=("${name%%_*} (build)")
        continue
    fi
    echo
    "$exe"
    code=$?
    case $code in
        0) ;;
        77) ;;  # no suitable GPU: the stage said so
        *) echo "stage ${name%%_*} exited with $code"; failed+=("${name%%_*} (exit $code)") ;;
    esac
done

echo
if grep -q '^FA_HAVE_DOCS:INTERNAL=ON' build/CMakeCache.txt; then
    if cmake --build --preset default --target docs >/tmp/flashcourse-docs.log 2>&1; then
        echo "lessons: open build/docs/html/index.html"
    else
        tail -20 /tmp/flashcourse-docs.log
        echo "lessons: the docs build failed (log: /tmp/flashcourse-docs.log)"
        failed+=("docs")
    fi
else
    echo "lessons: not built here: this configuration has no 'docs' target (the configure step said why)"
fi

if [[ $build_ok -eq 0 && ${#failed[@]} -eq 0 ]]; then failed+=("build"); fi
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "course: not everything ran: ${failed[*]}"
    exit 1
fi
echo "course: every stage built here ran and passed"
