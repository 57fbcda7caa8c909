/* The reduced form of MPICH test/mpi's comm/comm_idup_isend (see
 * ffi/ompi/tests/mpich/known-failures): DUPS (default 4; 2 suffice)
 * MPI_Comm_idup of one intercommunicator (the world split in half) at
 * once, completed by polling with MPI_Testall. In the rxe guest, with
 * Debian's Open MPI 4.1.4:
 *
 *   mpicc -o intercomm_idup intercomm_idup.c
 *   mpirun -np 4 --mca pml ob1 --mca btl self,xrc ./intercomm_idup [DUPS]
 *
 * never completes over self,xrc and completes over self,tcp and
 * self,vader; with DUPS 1 it completes over all three. Every message xrc
 * was given is delivered: the ranks deadlock because Open MPI's CID
 * agreement for intercommunicators starts its nonblocking collectives on
 * the local communicator in the order its earlier steps complete, which
 * differs between the leader and the others, so their libnbc tags
 * disagree; tcp's and vader's timing happens to keep the order. It prints
 * how far each rank got, and after LIMIT seconds (30) which of its idups
 * are still open. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

enum { MAX_DUPS = 16, LIMIT = 30 };

int main(int argc, char **argv)
{
    int dups = argc > 1 ? atoi(argv[1]) : 4;
    int wrank, wsize, left, done = 0, said = 0;
    MPI_Comm local, inter, dup[MAX_DUPS];
    MPI_Request req[MAX_DUPS];

    if (dups < 1 || dups > MAX_DUPS) {
        fprintf(stderr, "intercomm_idup: DUPS must be 1 to %d\n", MAX_DUPS);
        return 2;
    }
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    MPI_Comm_size(MPI_COMM_WORLD, &wsize);
    if (wsize < 2) {
        fprintf(stderr, "intercomm_idup: needs at least 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    /* The world split in half, the halves joined by their first ranks. */
    left = wrank < wsize / 2;
    MPI_Comm_split(MPI_COMM_WORLD, left, wrank, &local);
    MPI_Intercomm_create(local, 0, MPI_COMM_WORLD, left ? wsize / 2 : 0, 1234, &inter);
    for (int i = 0; i < dups; i++)
        MPI_Comm_idup(inter, &dup[i], &req[i]);
    printf("rank %d: %d idups started\n", wrank, dups);
    fflush(stdout);
    double start = MPI_Wtime();
    while (!done) {
        MPI_Testall(dups, req, &done, MPI_STATUSES_IGNORE);
        if (!done && !said && MPI_Wtime() - start > LIMIT) {
            for (int i = 0; i < dups; i++) {
                int one = 0;
                MPI_Test(&req[i], &one, MPI_STATUS_IGNORE);
                if (!one)
                    printf("rank %d: idup %d still open after %d s\n", wrank, i, LIMIT);
            }
            fflush(stdout);
            said = 1;
        }
    }
    printf("rank %d: all idups complete\n", wrank);
    for (int i = 0; i < dups; i++)
        MPI_Comm_free(&dup[i]);
    MPI_Comm_free(&inter);
    MPI_Comm_free(&local);
    MPI_Finalize();
    return 0;
}
