#!/usr/bin/env bash
# Builds flashcourse and runs the course: every stage in order, each printing its report and
# checking itself against the stage before it. Stages that need a GPU say so in one line and
# are skipped when none is present. Then builds the lessons as a Doxygen site.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)"

failed=0
for dir in stages/[0-9][0-9]_*/; do
    name=$(basename "$dir")                  # 04_cpu_tiling
    exe="build/stages/$name/stage${name}"    # build/stages/04_cpu_tiling/stage04_cpu_tiling
    if [[ ! -x "$exe" ]]; then
        echo "== stage ${name%%_*}: not built (its GPU code needs nvcc; the CPU stages do not) =="
        continue
    fi
    echo
    set +e
    "$exe"
    code=$?
    set -e
    case $code in
        0) ;;
        77) ;;  # no GPU: the stage said so
        *) echo "stage ${name%%_*} exited with $code"; failed=1 ;;
    esac
done

echo
cmake --build --preset default --target docs >/dev/null && echo "lessons: open build/docs/html/index.html"
exit $failed
