# expect CODE PATTERN ARGS...: runs "$exe" ARGS and passes when it exits with CODE and its output
# (stdout and stderr) matches PATTERN (grep -E); otherwise prints the end of the output and adds one
# to failures. Sourced by the command-line tests, which set exe and failures.
expect() {
    local code=$1 pattern=$2
    shift 2
    local out
    out=$("$exe" "$@" 2>&1)
    local got=$?
    if [[ $got -ne $code ]] || ! grep -qE -- "$pattern" <<<"$out"; then
        echo "FAIL: $exe $* -> exit $got (want $code), output should match '$pattern':"
        echo "$out" | tail -25
        failures=$((failures + 1))
    fi
}
