/*
 * What the MPI test programs share (xrc_mpi_test.c, xrc_rma_test.c): the
 * job's rank, size and pair, a check that aborts the job with its reason,
 * the PASS line, and the start.
 */
#ifndef XRC_MPI_TEST_H
#define XRC_MPI_TEST_H

#include <mpi.h>
#include <stdio.h>
#include <string.h>

static int rank, size, peer;

#define CHECK(c, ...)                                                                  \
    do {                                                                               \
        if (!(c)) {                                                                    \
            fprintf(stderr, "rank %d: FAIL %s:%d: %s: ", rank, __FILE__, __LINE__, #c); \
            fprintf(stderr, __VA_ARGS__);                                              \
            fprintf(stderr, "\n");                                                     \
            MPI_Abort(MPI_COMM_WORLD, 1);                                              \
        }                                                                              \
    } while (0)

/* Rank 0 says PASS once every rank got here. */
static void passed(const char *name)
{
    MPI_Barrier(MPI_COMM_WORLD);
    if (0 == rank) printf("PASS %s\n", name);
    fflush(stdout);
}

/* MPI_Init_thread, asking for MPI_THREAD_MULTIPLE only when a test named
 * "threads" is among the arguments (osc/pt2pt, the one-sided component on a
 * device without atomics, refuses windows under it); sets rank, size and
 * peer (ranks pair up as r and r^1, so a job that runs any test needs an
 * even size; with no test named, one rank only starts and finalizes). Returns
 * the thread level provided. */
static int test_start(int *argc, char ***argv, const char *program)
{
    int provided, want = MPI_THREAD_SINGLE;
    for (int i = 1; i < *argc; i++)
        if (!strcmp((*argv)[i], "threads")) want = MPI_THREAD_MULTIPLE;
    MPI_Init_thread(argc, argv, want, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size % 2 && *argc > 1) {
        if (0 == rank) fprintf(stderr, "%s needs an even number of ranks\n", program);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    peer = rank ^ 1;
    return provided;
}

#endif
