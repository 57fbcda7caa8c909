# Sourced inside a softrdma-vm guest by scripts/guest-faults,
# ffi/ompi/tests/guest-suite and ffi/ompi/tests/mpich/mpiexec.
#
#   rdma_res_back BASELINE SECONDS
#
# Waits for the devices' verbs objects (`rdma res show`) to be BASELINE
# again after a job: the kernel frees a process's objects once it has
# exited, and the job's launcher may return first. Polls every 0.5 s for
# at most SECONDS; returns 0 when they match, else prints the last
# reading and returns 1.
rdma_res_back() {
    local end=$((SECONDS + $2)) now
    while now=$(rdma res show) && [ "$now" != "$1" ] && [ $SECONDS -lt $end ]; do
        sleep 0.5
    done
    # Also when `rdma res show` itself failed.
    [ "$now" = "$1" ] || { printf '%s' "$now"; return 1; }
}
