# shellcheck shell=bash disable=SC2034 # mpi_env, mpi_cmd and mpi_root are the callers'
# Sourced by scripts/test-ofi, scripts/guest-mpi-ofi and
# scripts/check-mpi-doc: how each MPI library is built against and pointed
# at the libfabric provider. The README's commands are these
# (check-mpi-doc renders them and requires each in the README).
#
# mpi_build NAME VENV OUT: builds the MPI test program
# (ffi/ompi/tests/xrc_mpi_test.c) into OUT with the mpicc of the library
# NAME installed in VENV (scripts/mpi-venvs; /usr for Debian's Open MPI
# 4.1). Intel's wrapper (impi) substitutes its installation directory
# from I_MPI_ROOT, and its MPI_STATUSES_IGNORE trips gcc's
# -Wstringop-overflow, so that warning alone is let through there.
mpi_build() {
    local name=$1 venv=$2 out=$3 flags=(-O1 -Wall -Werror -pthread) cc=("$2/bin/mpicc")
    case $name in
        impi)
            cc=(env I_MPI_ROOT="$venv" "$venv/bin/mpicc")
            flags+=(-Wno-stringop-overflow) ;;
        ompi4*) cc=(mpicc) ;;
    esac
    "${cc[@]}" "${flags[@]}" ffi/ompi/tests/xrc_mpi_test.c -o "$out"
}

# mpi_setup NAME VENV NP: sets mpi_env (the environment's assignments)
# and mpi_cmd (the launcher with its options, the program to follow) that
# start NP ranks of library NAME over the provider, with FI_PROVIDER_PATH
# (which must name the provider's directory already) as it is now. The
# names: mpich (MPICH 5 ch4:ofi; rsmpi, a Rust program linked against it,
# the same), openmpi (Open MPI 5 mtl/ofi), impi (Intel MPI), ompi4-mtl and
# ompi4-table (Debian's Open MPI 4.1 mtl/ofi, AV map and AV table),
# ompi4-btl (its ob1 over btl/ofi, one-sided through osc/rdma), ompi4-btl-msg
# (the same for messages alone, one-sided through osc/pt2pt). Which
# hosts are the caller's to add; so is mpi_root, which mpi_setup sets to
# the option Open MPI's launchers want to run as root, when root runs them.
mpi_setup() {
    local name=$1 venv=$2 np=$3
    mpi_env=() mpi_cmd=() mpi_root=()
    [[ $name != openmpi && $name != ompi4* ]] || [ "$(id -u)" != 0 ] || mpi_root=(--allow-run-as-root)
    case $name in
        mpich | rsmpi)
            # Without the version pin MPICH 5 asks for API 2.5 and skips the
            # provider; without NOLOCAL ranks of one node use shared memory.
            mpi_env=(MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=xrc MPIR_CVAR_CH4_OFI_MAJOR_VERSION=1
                     MPIR_CVAR_CH4_OFI_MINOR_VERSION=18 MPIR_CVAR_NOLOCAL=1)
            mpi_cmd=("$venv/bin/mpiexec" -n "$np") ;;
        impi)
            # Intel's own providers' directory stays on the path.
            mpi_env=(FI_PROVIDER_PATH="$FI_PROVIDER_PATH:$venv/lib/libfabric/prov" I_MPI_OFI_PROVIDER=xrc
                     I_MPI_FABRICS=ofi)
            mpi_cmd=("$venv/bin/mpiexec" -n "$np") ;;
        openmpi)
            mpi_cmd=("$venv/bin/mpiexec" -n "$np" --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include xrc) ;;
        ompi4-mtl)
            mpi_cmd=(mpirun -np "$np" --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include xrc) ;;
        ompi4-table)
            mpi_cmd=(mpirun -np "$np" --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include xrc
                     --mca mtl_ofi_av table) ;;
        ompi4-btl)
            # btl_ofi_mode 2: messages and RMA (it asks FI_RMA | FI_ATOMIC).
            mpi_cmd=(mpirun -np "$np" --mca pml ob1 --mca btl self,ofi --mca btl_ofi_provider_include xrc
                     --mca btl_ofi_mode 2 --mca osc rdma) ;;
        ompi4-btl-msg)
            # btl_ofi_mode 1: messages alone (FI_MSG), for devices without
            # atomics; one-sided over them through osc/pt2pt.
            mpi_cmd=(mpirun -np "$np" --mca pml ob1 --mca btl self,ofi --mca btl_ofi_provider_include xrc
                     --mca btl_ofi_mode 1 --mca osc pt2pt) ;;
        *) echo "mpi_setup: no library $name" >&2; return 1 ;;
    esac
}

# mpi_hosts NAME VENV PER: sets mpi_hosts, the options that place PER ranks
# on each of the two nodes n1 and n2 of a two-node softrdma-vm guest
# (started through scripts/netns-rsh), for library NAME as mpi_setup names
# it; on one node (PER empty), what lets Open MPI put more ranks than cores.
mpi_hosts() {
    local name=$1 venv=$2 per=${3:-} rsh=$PWD/scripts/netns-rsh
    mpi_hosts=()
    case $name in
        mpich | impi | rsmpi)
            [ -z "$per" ] || mpi_hosts=(-launcher rsh -launcher-exec "$rsh" -hosts n1,n2 -ppn "$per") ;;
        openmpi)
            mpi_hosts=(--map-by :OVERSUBSCRIBE)
            [ -z "$per" ] || mpi_hosts=(--prefix "$venv" --host "n1:$per,n2:$per" --map-by node:OVERSUBSCRIBE
                                        --prtemca plm_ssh_agent "$rsh") ;;
        ompi4*)
            mpi_hosts=(--oversubscribe)
            [ -z "$per" ] || mpi_hosts=(--oversubscribe --host "n1:$per,n2:$per" --map-by node --mca plm rsh
                                        --mca plm_rsh_agent "$rsh") ;;
    esac
}

# mpi_two_nodes: inside a two-node softrdma-vm guest, names n1 and n2 in
# /etc/hosts and sets mpi_launch, the prefix that starts a launcher on n1
# under that host name (the other ranks' processes start through
# netns-rsh, and find n1 by name).
mpi_two_nodes() {
    grep -q ' n2$' /etc/hosts || printf '192.168.77.1 n1\n192.168.77.2 n2\n' >>/etc/hosts
    mpi_launch=(ip netns exec n1 unshare -u sh -c 'hostname n1 && exec "$@"' launch)
}
