# Sourced inside a softrdma-vm guest by scripts/guest-osu, perf-compare and
# sw-cost: one benchmark's server in the background, its client in the
# foreground.
#
#   pair_run SERVER_LOG SERVER CLIENT
#
# SERVER and CLIENT are shell command lines (redirections allowed). Under
# TCG a server can take seconds to listen, and a client that finds no
# listener fails at once (perftest: RDMA_CM_EVENT_REJECTED, error 8): the
# client is tried again, 0.3 s apart, up to 20 times, while the server is
# still running. A client that fails for good takes its server down with it,
# so that nothing waits out the server's timeout.
# Returns 0, 1 (the client failed) or 2 (the server failed).
pair_run() {
    local log=$1 server=$2 client=$3 tries=0 s
    timeout 600 bash -c "$server" > "$log" 2>&1 &
    s=$!
    until timeout 600 bash -c "$client"; do
        tries=$((tries + 1))
        if [ $tries -ge 20 ] || ! kill -0 $s 2>/dev/null; then
            kill $s 2>/dev/null
            wait $s 2>/dev/null
            return 1
        fi
        sleep 0.3
    done
    wait $s || return 2
}
