# Sourced inside a softrdma-vm guest by scripts/guest-osu, perf-compare and
# sw-cost: one benchmark's server in the background, its client in the
# foreground.
#
#   pair_run SERVER_LOG PORT SERVER CLIENT
#
# SERVER and CLIENT are shell command lines (redirections and pipes
# allowed: a pipeline fails with any of its commands, so that a client
# piped into grep or tee still counts as failed when it fails). The client
# starts once the server listens on PORT: a TCP socket (osu_*'s exchange)
# or an RDMA CM listener (perftest's -R), as `ss` and `rdma res` show them.
# So no client races a server that emulation makes slow to start, and no
# failure is tried again: a client that fails fails the pair.
# With PAIR_NETNS set, the server's port is looked for in that network
# namespace (where the server runs on a two-node guest).
# Returns 0, 1 (the client failed) or 2 (the server failed, or never
# listened). Each side is bounded, against a hang only: 600 s to run, 300 s
# to listen (the harness's limits, said when reached).
pair_run() {
    local log=$1 port=$2 server=$3 client=$4 s rc end
    timeout 600 bash -c "$server" > "$log" 2>&1 &
    s=$!
    end=$((SECONDS + 300))
    until pair_listening "$port"; do
        if ! kill -0 $s 2>/dev/null; then
            wait $s
            rc=$?
            echo "pair_run: the server exited $rc before it listened on port $port" >&2
            return 2
        fi
        if [ $SECONDS -ge $end ]; then
            echo "pair_run: the server did not listen on port $port within 300 s (the harness's limit)" >&2
            kill $s 2>/dev/null
            wait $s 2>/dev/null
            return 2
        fi
        sleep 0.1
    done
    if timeout 600 bash -o pipefail -c "$client"; then
        wait $s || return 2
        return 0
    fi
    kill $s 2>/dev/null
    wait $s 2>/dev/null
    return 1
}

# pair_listening PORT: whether a TCP socket or an RDMA CM id listens on PORT.
pair_listening() {
    local ns=()
    [ -n "${PAIR_NETNS:-}" ] && ns=(ip netns exec "$PAIR_NETNS")
    "${ns[@]}" ss -ltnH "sport = :$1" 2>/dev/null | grep -q . && return 0
    "${ns[@]}" rdma res show cm_id 2>/dev/null | grep -Eq "state LISTEN .*src-addr [^ ]*:$1( |$)"
}
