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
# failure is tried again but one, which is perftest's own race: with -R its
# server listens twice (once for its exchange, then again for the data
# QPs' connections), and a client whose second connect arrives before the
# second listen is rejected with reason 8 (no such service: CI saw it on
# rxe, and here 1 ib_write_bw pair in 90 lost it; perftest 4.5's client
# does not try again). On iWARP the same race is a TCP connection refused
# ("Failed to connect through RDMA CM." with "ERRNO: Connection refused.":
# CI saw it on siw). A client that failed with exactly one of those on its
# stderr has the pair run again, at most PAIR_TRIES (5) times in all, each
# try said. Every other failure fails the pair.
# With PAIR_NETNS set, the server's port is looked for in that network
# namespace (where the server runs on a two-node guest).
# Returns 0, 1 (the client failed) or 2 (the server failed, or never
# listened). Each side is bounded, against a hang only: 600 s to run, 300 s
# to listen (the harness's limits, said when reached).
pair_run() {
    local try rc
    for try in $(seq 1 "${PAIR_TRIES:-5}"); do
        pair_try "$@"
        rc=$?
        [ $rc = 3 ] || return $rc
        echo "pair_run: try $try: perftest's client was refused (rejected with reason 8, or on iWARP connection refused) before its server listened again for the data connection; the pair runs again" >&2
    done
    echo "pair_run: perftest's listen race lost ${PAIR_TRIES:-5} times in a row" >&2
    return 1
}

# pair_try: pair_run's one try; 3 when the client lost perftest's race.
pair_try() {
    local log=$1 port=$2 server=$3 client=$4 s c rc end lost
    # A server killed a moment ago (the last try's) may still be listed.
    end=$((SECONDS + 300))
    while pair_listening "$port"; do
        if [ $SECONDS -ge $end ]; then
            echo "pair_run: something still listens on port $port after 300 s (the harness's limit)" >&2
            return 2
        fi
        sleep 0.1
    done
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
    # The client's stderr is watched while it runs: having lost the race,
    # perftest's client does not always exit (it was seen to wait out the
    # harness's 600 s), so it is stopped as soon as it says so.
    : > "$log.client-err" # not the last try's words, before the client opens it
    timeout 600 bash -o pipefail -c "$client" 2> "$log.client-err" &
    c=$!
    lost=0
    while kill -0 $c 2>/dev/null; do
        if pair_lost "$log.client-err"; then
            lost=1
            kill $c
            break
        fi
        sleep 0.1
    done
    wait $c
    rc=$?
    cat "$log.client-err" >&2
    if [ $rc = 0 ] && [ $lost = 0 ]; then
        wait $s || return 2
        return 0
    fi
    kill $s 2>/dev/null
    wait $s 2>/dev/null
    [ $lost = 1 ] && return 3
    pair_lost "$log.client-err" && return 3
    return 1
}

# pair_lost FILE: whether the client's stderr in FILE says it lost
# perftest's listen race: rejected with reason 8 (InfiniBand, RoCE), or
# refused by TCP (iWARP).
pair_lost() {
    grep -q 'RDMA_CM_EVENT_REJECTED; error: 8\.' "$1" && return 0
    grep -q '^Failed to connect through RDMA CM\.' "$1" && grep -q '^ERRNO: Connection refused\.' "$1"
}

# pair_listening PORT: whether a TCP socket or an RDMA CM id listens on PORT.
pair_listening() {
    local ns=()
    [ -n "${PAIR_NETNS:-}" ] && ns=(ip netns exec "$PAIR_NETNS")
    "${ns[@]}" ss -ltnH "sport = :$1" 2>/dev/null | grep -q . && return 0
    "${ns[@]}" rdma res show cm_id 2>/dev/null | grep -Eq "state LISTEN .*src-addr [^ ]*:$1( |$)"
}
