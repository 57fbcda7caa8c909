# Sourced by scripts/guest-tests, guest-faults, guest-ompi, guest-mpich,
# guest-osu, guest-ofi and guest-mpi-ofi:
# one guest boot per device, the boots side by side. Single-threaded TCG
# keeps a guest on one host core, so two devices' boots on two cores take
# the time of the longer one. Each line of a boot's output is printed as it
# comes, prefixed with the device.
#
#   on_devices NAME FUNCTION DEVICE...
#   guest_nodes DEVICE
#
# FUNCTION DEVICE runs that device's boot and returns 0 if it passed (a
# DEVICE may name a part of a device's work, as siw:PART, for a script
# that spreads one device's runs over two boots). on_devices returns 0 if
# every one did. GUEST_JOBS (default: the host's cores) bounds the boots
# at once, in the order given, the next starting as soon as any one ends;
# 1 runs them one after another. A
# signal to the script takes its boots down (softrdma-vm takes its guest
# with it) before the script exits.
on_devices() {
    local name=$1 fn=$2 d status=0 jobs=${GUEST_JOBS:-$(nproc)}
    shift 2
    local pids=()
    trap 'kill -TERM "${pids[@]}" 2>/dev/null; wait; exit 130' INT TERM HUP
    for d in "$@"; do
        # At most $jobs at once: the next starts when any one ends.
        [ "${#pids[@]}" -lt "$jobs" ] || reap_one || status=1
        (
            t0=$(date +%s)
            "$fn" "$d" 2>&1 | sed -u "s/^/[$d] /"
            rc=${PIPESTATUS[0]}
            echo "$name: $d: exit $rc in $(( $(date +%s) - t0 )) s"
            exit "$rc"
        ) &
        pids+=($!)
    done
    while [ "${#pids[@]}" -gt 0 ]; do
        reap_one || status=1
    done
    trap - INT TERM HUP
    return $status
}

# reap_one: waits for any one of on_devices' boots ($pids) to end, takes
# it off the list and returns its status.
reap_one() {
    local done_pid="" rc p left=()
    wait -n -p done_pid "${pids[@]}"
    rc=$?
    for p in "${pids[@]}"; do
        [ "$p" = "$done_pid" ] || left+=("$p")
    done
    pids=("${left[@]}")
    # No pid: the wait itself failed.
    [ -n "$done_pid" ] || return 1
    return $rc
}

# How many nodes (network namespaces of the one guest, joined by a veth
# pair: scripts/softrdma-vm --nodes) a device's boot spreads its ranks
# over: two for siw, so that traffic crosses a link; one for rxe, which
# carries no traffic across namespaces.
guest_nodes() {
    if [ "$1" = siw ]; then echo 2; else echo 1; fi
}
