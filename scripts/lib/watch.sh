# Sourced by ffi/ompi/tests/guest-suite (inside a softrdma-vm guest).
#
#   run_watched LIMIT STACKS COMMAND...
#
# Runs COMMAND (its output goes where the caller's does) with a time limit
# against a hang, as `timeout -k 10 LIMIT` does, and returns its exit
# status, or 124 when the limit ended it. Before it ends a hung command,
# it writes to the file STACKS every thread's stack of every process the
# command started (its descendants: mpirun's ranks), from gdb, so that a
# hang that does not come back on its own can still be read afterwards.
run_watched() {
    local limit=$1 stacks=$2 pid watcher fired
    shift 2
    fired=$(mktemp)
    rm -f "$fired"
    "$@" &
    pid=$!
    (
        sleep "$limit"
        # The command may have ended between the sleep and this: then
        # there is nothing to read or to kill.
        kill -0 "$pid" 2>/dev/null || exit 0
        : >"$fired"
        watch_stacks "$pid" >"$stacks" 2>&1
        rest=$(watch_descendants "$pid")
        # shellcheck disable=SC2086
        kill -TERM "$pid" $rest 2>/dev/null
        sleep 10
        # shellcheck disable=SC2086
        kill -KILL "$pid" $rest 2>/dev/null
    ) &
    watcher=$!
    wait "$pid"
    local rc=$?
    if [ -e "$fired" ]; then
        # It ended the command: it kills what is left, then returns.
        wait "$watcher" 2>/dev/null
        rm -f "$fired"
        return 124
    fi
    # The watcher and its sleep, when the command ended in time.
    pkill -P "$watcher" 2>/dev/null
    kill "$watcher" 2>/dev/null
    wait "$watcher" 2>/dev/null
    return "$rc"
}

# watch_descendants PID: the pids of PID's descendants, parents first.
watch_descendants() {
    local p
    for p in $(pgrep -P "$1"); do
        echo "$p"
        watch_descendants "$p"
    done
}

# watch_stacks PID: every thread's stack of PID and its descendants.
watch_stacks() {
    local p
    for p in "$1" $(watch_descendants "$1"); do
        echo "=== pid $p: $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)"
        if command -v gdb >/dev/null; then
            timeout 300 gdb -q -batch -p "$p" -ex "thread apply all bt" 2>&1 |
                grep -v '^\[New LWP\|^\[Thread debugging\|^Using host libthread_db'
        else
            echo "(no gdb: the kernel's stacks only)"
            for t in /proc/"$p"/task/*; do
                echo "--- thread ${t##*/} ($(cat "$t/comm" 2>/dev/null))"
                cat "$t/stack" 2>/dev/null
            done
        fi
    done
}
