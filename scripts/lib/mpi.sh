# Sourced by scripts/test-ofi and scripts/guest-mpi-ofi.
#
# mpi_build NAME VENV OUT: builds the MPI test program
# (ffi/ompi/tests/xrc_mpi_test.c) into OUT with the mpicc of the library
# NAME installed in VENV (scripts/mpi-venvs). Intel's wrapper (impi)
# substitutes its installation directory from I_MPI_ROOT, and its
# MPI_STATUSES_IGNORE trips gcc's -Wstringop-overflow, so that warning
# alone is let through there.
mpi_build() {
    local name=$1 venv=$2 out=$3 flags=(-O1 -Wall -Werror -pthread) cc=("$2/bin/mpicc")
    if [ "$name" = impi ]; then
        cc=(env I_MPI_ROOT="$venv" "$venv/bin/mpicc")
        flags+=(-Wno-stringop-overflow)
    fi
    "${cc[@]}" "${flags[@]}" ffi/ompi/tests/xrc_mpi_test.c -o "$out"
}
