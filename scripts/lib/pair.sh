# Sourced inside a softrdma-vm guest by scripts/guest-osu, perf-compare and
# sw-cost: one benchmark's server in the background, its client in the
# foreground.
#
#   pair_run SERVER_LOG SERVER CLIENT
#
# SERVER and CLIENT are shell command lines (redirections and pipes
# allowed: a pipeline fails with any of its commands, so that a client
# piped into grep or tee still counts as failed when it fails). Under
# TCG a server can take seconds to listen, and a client that finds no
# listener fails at once (perftest: RDMA_CM_EVENT_REJECTED, error 8), or
# half-connects and leaves its server waiting for it. So when the client
# fails while its server still runs, both are started afresh: the server
# is killed, and the pair tried again, up to 5 times. A client that fails
# after its server has exited, or 5 times, fails the pair; no server is
# left behind to wait out its timeout.
# Returns 0, 1 (the client failed) or 2 (the server failed).
pair_run() {
    local log=$1 server=$2 client=$3 try s
    for try in 1 2 3 4 5; do
        timeout 600 bash -c "$server" > "$log" 2>&1 &
        s=$!
        sleep 0.5
        if timeout 600 bash -o pipefail -c "$client"; then
            wait $s || return 2
            return 0
        fi
        if ! kill -0 $s 2>/dev/null; then
            wait $s
            return 1
        fi
        kill $s 2>/dev/null
        wait $s 2>/dev/null
        sleep 1
    done
    return 1
}
