/*
 * MPI-level latency and bandwidth, measured through MPI itself the way the
 * OSU micro-benchmarks 7.4 measure them (osu_latency: blocking ping-pong,
 * half the round trip; osu_bw: a window of non-blocking sends answered by
 * one short reply; osu_bibw: both ranks send a window and receive the
 * other's), printed in their format. Two ranks. Which transport
 * carries the messages is mpirun's choice (scripts/guest-osu runs it over
 * ob1 with xrc and with tcp).
 *
 *   osu_mpi latency|bw|bibw [-n MIN] [-m MAX] [-i ITERS] [-x WARMUP] [-w WINDOW]
 *
 * Sizes double from MIN (default 0 for latency, 1 otherwise) to MAX.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int rank, size, latency, bibw, opt;
    long min = -1, max = 1 << 22, iters = 1000, warmup = 100, window = 64;
    char *s = NULL, *r = NULL;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 2 || (strcmp(argv[1], "latency") && strcmp(argv[1], "bw") && strcmp(argv[1], "bibw")) || 2 != size) {
        if (0 == rank) fprintf(stderr, "usage: mpirun -np 2 osu_mpi latency|bw|bibw [-n MIN] [-m MAX] [-i ITERS] [-x WARMUP] [-w WINDOW]\n");
        MPI_Finalize();
        return 2;
    }
    latency = !strcmp(argv[1], "latency");
    bibw = !strcmp(argv[1], "bibw");
    optind = 2;
    while ((opt = getopt(argc, argv, "n:m:i:x:w:")) != -1) {
        switch (opt) {
        case 'n': min = atol(optarg); break;
        case 'm': max = atol(optarg); break;
        case 'i': iters = atol(optarg); break;
        case 'x': warmup = atol(optarg); break;
        case 'w': window = atol(optarg); break;
        default: MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (posix_memalign((void **) &s, 4096, (size_t) max + 1) || posix_memalign((void **) &r, 4096, (size_t) max + 1))
        MPI_Abort(MPI_COMM_WORLD, 1);
    memset(s, 'a', (size_t) max + 1);
    memset(r, 'b', (size_t) max + 1);
    if (0 == rank) {
        printf(latency ? "# OSU MPI Latency Test v7.4\n"
               : bibw ? "# OSU MPI Bi-Directional Bandwidth Test v7.4\n" : "# OSU MPI Bandwidth Test v7.4\n");
        printf("# Datatype: MPI_CHAR.\n");
        printf("%-10s%20s\n", "# Size", latency ? "Avg Latency(us)" : "Bandwidth (MB/s)");
        fflush(stdout);
    }
    for (long n = min >= 0 ? min : latency ? 0 : 1; n <= max; n = n ? n * 2 : 1) {
        double t0 = 0.0, t;
        /* Fewer rounds for large messages, as OSU does. */
        long it = n > 8192 ? (iters / 10 > 0 ? iters / 10 : 1) : iters;
        long wu = n > 8192 ? (warmup / 10 > 0 ? warmup / 10 : 1) : warmup;
        MPI_Barrier(MPI_COMM_WORLD);
        for (long i = 0; i < it + wu; i++) {
            if (i == wu) t0 = MPI_Wtime();
            if (latency) {
                if (0 == rank) {
                    MPI_Send(s, (int) n, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
                    MPI_Recv(r, (int) n, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else {
                    MPI_Recv(r, (int) n, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    MPI_Send(s, (int) n, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
                }
            } else if (bibw) {
                MPI_Request q[512];
                long w = window > 256 ? 256 : window;
                for (long k = 0; k < w; k++) MPI_Irecv(r, (int) n, MPI_CHAR, 1 - rank, 100, MPI_COMM_WORLD, &q[k]);
                for (long k = 0; k < w; k++) MPI_Isend(s, (int) n, MPI_CHAR, 1 - rank, 100, MPI_COMM_WORLD, &q[w + k]);
                MPI_Waitall((int) (2 * w), q, MPI_STATUSES_IGNORE);
            } else {
                MPI_Request q[256];
                long w = window > 256 ? 256 : window;
                if (0 == rank) {
                    for (long k = 0; k < w; k++) MPI_Isend(s, (int) n, MPI_CHAR, 1, 100, MPI_COMM_WORLD, &q[k]);
                    MPI_Waitall((int) w, q, MPI_STATUSES_IGNORE);
                    MPI_Recv(r, 4, MPI_CHAR, 1, 101, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else {
                    for (long k = 0; k < w; k++) MPI_Irecv(r, (int) n, MPI_CHAR, 0, 100, MPI_COMM_WORLD, &q[k]);
                    MPI_Waitall((int) w, q, MPI_STATUSES_IGNORE);
                    MPI_Send(s, 4, MPI_CHAR, 0, 101, MPI_COMM_WORLD);
                }
            }
        }
        t = MPI_Wtime() - t0;
        if (0 == rank) {
            if (latency) printf("%-10ld%20.2f\n", n, t * 1e6 / (2.0 * (double) it));
            else printf("%-10ld%20.2f\n", n, (bibw ? 2.0 : 1.0) * (double) n * (double) it * (double) (window > 256 ? 256 : window) / t / 1e6);
            fflush(stdout);
        }
    }
    free(s);
    free(r);
    MPI_Finalize();
    return 0;
}
