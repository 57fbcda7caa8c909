# Reading the list files of this directory (subset, not-built,
# known-failures); sourced by scripts/guest-mpich on the host and by
# mpiexec in the guest.
#
#   listed FILE KEY                   is KEY the first field of a line of FILE?
#   known_failure FILE DEVICE TEST NP is TEST with NP ranks listed for DEVICE or any?
listed() {
    grep -v '^#' "$1" | cut -f1 | grep -qxF "$2"
}
known_failure() {
    listed "$1" "$2 $3 $4" || listed "$1" "any $3 $4"
}
