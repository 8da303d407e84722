#!/usr/bin/env bash
# The shell half of the fresh-copy checks: the copy, one of the README's commands timed in it, and
# scripts/test.sh started detached and waited for. The records that drive it, and that write
# newcomer.txt and newcomer_test.txt from what it leaves, are bench/session/newcomer.py's
# (python3 bench/session.py list newcomer newcomer_test newcomer_test_start newcomer_wait).
#
#   bench/newcomer.sh copy DIR                       the working tree into DIR (emptied first)
#   bench/newcomer.sh run DIR LIMIT STATUS CMD...    CMD in DIR, cut after LIMIT seconds; its output
#                                                    on stdout, then STATUS (JSON: exit, seconds,
#                                                    start, end); exits as CMD did
#   bench/newcomer.sh start DIR LIMIT TEST_DIR       `run` of scripts/test.sh in DIR, detached: its
#                                                    log TEST_DIR/test.log, its STATUS TEST_DIR/status.json
#   bench/newcomer.sh wait TEST_DIR SECONDS          until TEST_DIR/status.json is there, up to SECONDS
#                                                    more; exits as scripts/test.sh did, 75 while it runs
#
# Run from the repository root. The environment passes through to CMD: the records set
# FA_SKIP_INSTALL=1 and CMAKE_PREFIX_PATH (the packages of .deps/ unpacked into /tmp/deps).
set -u -o pipefail

now() { date -u '+%F %H:%M UTC'; }

# The working tree as it stands, without build folders, packages or git's own folder (on the
# device machine .git may be older than the tree it came with, so git archive is not used).
cmd_copy() {
    local dir=$1
    rm -rf "$dir" && mkdir -p "$dir" || return 1
    tar -c --exclude='./build*' --exclude=./.deps --exclude=./.whl --exclude=./.git . | tar -x -C "$dir" || return 1
    echo "copy: the working tree without build folders, .deps, .whl, .git, in $dir"
}

cmd_run() {
    local dir=$1 limit=$2 status=$3 t0=$SECONDS start rc
    shift 3
    start=$(now)
    (cd "$dir" && timeout "$limit" "$@") </dev/null 2>&1
    rc=$?
    # Written whole, then renamed: `wait` never reads half a file.
    printf '{"exit": %d, "seconds": %d, "start": "%s", "end": "%s"}\n' "$rc" "$((SECONDS - t0))" "$start" "$(now)" \
        >"$status.part" && mv -f "$status.part" "$status"
    return "$rc"
}

cmd_start() {
    local dir=$1 limit=$2 test_dir=$3
    rm -rf "$test_dir"  # an earlier run's status must not pass for this one's
    [ -x "$dir/scripts/test.sh" ] || { echo "no fresh copy in $dir: make it first (the experiment newcomer)"; return 1; }
    mkdir -p "$test_dir" || return 1
    # setsid: a session of its own, so that the end of this call's process group does not end it.
    setsid bash "$0" run "$dir" "$limit" "$test_dir/status.json" scripts/test.sh </dev/null >"$test_dir/test.log" 2>&1 &
    echo "scripts/test.sh started in $dir, detached ($(now)); its log: $test_dir/test.log"
}

cmd_wait() {
    local test_dir=$1 limit=$2 waited=0 rc
    [ -d "$test_dir" ] || { echo "nothing started in $test_dir: start it first (the experiment newcomer_test_start)"; return 1; }
    while [ ! -f "$test_dir/status.json" ] && [ "$waited" -lt "$limit" ]; do
        sleep 1
        waited=$((waited + 1))
    done
    if [ ! -f "$test_dir/status.json" ]; then
        echo "scripts/test.sh still running after $waited s more: wait again (the experiment newcomer_wait)"
        tail -3 "$test_dir/test.log" 2>/dev/null
        return 75
    fi
    rc=$(sed -n 's/.*"exit": \([0-9]*\).*/\1/p' "$test_dir/status.json")
    echo "scripts/test.sh: exit ${rc:-unknown}"
    return "${rc:-1}"
}

usage() {
    echo "usage: bench/newcomer.sh copy DIR | run DIR LIMIT STATUS CMD... | start DIR LIMIT TEST_DIR | wait TEST_DIR SECONDS" >&2
    exit 2
}

case ${1:-} in
    copy) [ $# -eq 2 ] || usage; cmd_copy "$2" ;;
    run) [ $# -ge 5 ] || usage; cmd_run "${@:2}" ;;
    start) [ $# -eq 4 ] || usage; cmd_start "${@:2}" ;;
    wait) [ $# -eq 3 ] || usage; cmd_wait "${@:2}" ;;
    *) usage ;;
esac
