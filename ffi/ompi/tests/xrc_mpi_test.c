/*
 * MPI tests for mca_btl_xrc, with every byte checked. Run under mpirun with
 * --mca pml ob1 --mca btl self,xrc (scripts/guest-ompi does, on rxe and siw):
 *
 *   xrc_mpi_test TEST...      p2p sync dtype coll threads rma kill
 *
 * Any even number of ranks (ranks pair up as r and r^1). Rank 0 prints
 * "PASS test" once every rank passed it; the first failure aborts the job
 * with its reason.
 */
#define _GNU_SOURCE
#include "mpi_test.h"
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>



static unsigned char byte_of(int src, size_t n, size_t i) { return (unsigned char) (src * 131u + n * 7u + i * 13u + 1u); }

static void fill(unsigned char *b, int src, size_t n)
{
    for (size_t i = 0; i < n; i++) b[i] = byte_of(src, n, i);
}

/* The first wrong byte, or -1. */
static long wrong(const unsigned char *b, int src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != byte_of(src, n, i)) return (long) i;
    return -1;
}


/* Every size from 0 to 4 MiB (powers of two and their neighbours), blocking
 * and non-blocking, both ways; then 64 in flight at once per size. */
static void test_p2p(void)
{
    const size_t max = 4u << 20;
    unsigned char *s = malloc(max + 1), *r = malloc(max + 1);
    size_t sizes[80];
    int n = 0;

    sizes[n++] = 0;
    for (size_t k = 1; k <= max; k *= 2) {
        if (k > 2) sizes[n++] = k - 1;
        sizes[n++] = k;
        if (k < max && k > 1) sizes[n++] = k + 1;
    }
    for (int i = 0; i < n; i++) {
        size_t len = sizes[i];
        MPI_Status st;
        int count;
        fill(s, rank, len);
        memset(r, 0, len + 1);
        if (rank < peer) {
            MPI_Send(s, (int) len, MPI_BYTE, peer, i, MPI_COMM_WORLD);
            MPI_Recv(r, (int) len, MPI_BYTE, peer, i, MPI_COMM_WORLD, &st);
        } else {
            MPI_Recv(r, (int) len, MPI_BYTE, peer, i, MPI_COMM_WORLD, &st);
            MPI_Send(s, (int) len, MPI_BYTE, peer, i, MPI_COMM_WORLD);
        }
        MPI_Get_count(&st, MPI_BYTE, &count);
        CHECK((size_t) count == len, "blocking %zu bytes: count %d", len, count);
        CHECK(wrong(r, peer, len) < 0, "blocking %zu bytes: byte %ld", len, wrong(r, peer, len));
        CHECK(r[len] == 0, "blocking %zu bytes: wrote past the end", len);

        /* Non-blocking, both ways at once. */
        {
            MPI_Request q[2];
            memset(r, 0, len);
            MPI_Irecv(r, (int) len, MPI_BYTE, peer, 1000 + i, MPI_COMM_WORLD, &q[0]);
            MPI_Isend(s, (int) len, MPI_BYTE, peer, 1000 + i, MPI_COMM_WORLD, &q[1]);
            MPI_Waitall(2, q, MPI_STATUSES_IGNORE);
            CHECK(wrong(r, peer, len) < 0, "non-blocking %zu bytes: byte %ld", len, wrong(r, peer, len));
        }
    }
    /* A window of 64 messages in flight (osu_bw's pattern), 1 B to 1 MiB. */
    for (size_t len = 1; len <= (1u << 20); len *= 8) {
        enum { W = 64 };
        MPI_Request q[2 * W];
        unsigned char *in = malloc(len * W), *out = malloc(len * W);
        for (int w = 0; w < W; w++) fill(out + w * len, rank + w, len);
        for (int w = 0; w < W; w++) MPI_Irecv(in + w * len, (int) len, MPI_BYTE, peer, w, MPI_COMM_WORLD, &q[w]);
        for (int w = 0; w < W; w++) MPI_Isend(out + w * len, (int) len, MPI_BYTE, peer, w, MPI_COMM_WORLD, &q[W + w]);
        MPI_Waitall(2 * W, q, MPI_STATUSES_IGNORE);
        for (int w = 0; w < W; w++)
            CHECK(wrong(in + w * len, peer + w, len) < 0, "window of %d x %zu: message %d wrong", W, len, w);
        free(in);
        free(out);
    }
    free(s);
    free(r);
    passed("p2p");
}

/* MPI_Ssend, MPI_Probe/Iprobe, matched probes (MPI_Mprobe/Mrecv,
 * MPI_Improbe/Imrecv) and wildcard receives. */
static void test_sync(void)
{
    size_t lens[] = {0, 10, 5000, 100000, 3u << 20};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        size_t len = lens[i];
        unsigned char *b = malloc(len + 1);
        MPI_Status st;
        int count, flag = 0;
        if (rank < peer) {
            fill(b, rank, len);
            MPI_Ssend(b, (int) len, MPI_BYTE, peer, 77 + (int) i, MPI_COMM_WORLD);
            MPI_Recv(b, (int) len, MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
            CHECK(st.MPI_SOURCE == peer && st.MPI_TAG == 500 + (int) i, "wildcard: source %d tag %d", st.MPI_SOURCE,
                  st.MPI_TAG);
            CHECK(wrong(b, peer, len) < 0, "wildcard receive of %zu", len);
        } else {
            MPI_Probe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
            MPI_Get_count(&st, MPI_BYTE, &count);
            CHECK(st.MPI_SOURCE == peer && st.MPI_TAG == 77 + (int) i && (size_t) count == len,
                  "probe: source %d tag %d count %d", st.MPI_SOURCE, st.MPI_TAG, count);
            MPI_Recv(b, count, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            CHECK(wrong(b, peer, len) < 0, "ssend of %zu", len);
            fill(b, rank, len);
            MPI_Send(b, (int) len, MPI_BYTE, peer, 500 + (int) i, MPI_COMM_WORLD);
        }
        /* Iprobe until a message shows up. */
        if (rank < peer) {
            MPI_Send(&i, sizeof i, MPI_BYTE, peer, 9, MPI_COMM_WORLD);
        } else {
            while (!flag) MPI_Iprobe(peer, 9, MPI_COMM_WORLD, &flag, &st);
            MPI_Recv(&count, sizeof i, MPI_BYTE, peer, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        }
        /* Matched probes: MPI_Mprobe and MPI_Mrecv with a wildcard source,
         * then MPI_Improbe until it matches, and MPI_Imrecv. A message a
         * matched probe took is no other receive's. */
        if (rank < peer) {
            fill(b, rank, len);
            MPI_Send(b, (int) len, MPI_BYTE, peer, 600 + (int) i, MPI_COMM_WORLD);
            MPI_Send(b, (int) len, MPI_BYTE, peer, 700 + (int) i, MPI_COMM_WORLD);
        } else {
            MPI_Message m;
            MPI_Request q;
            MPI_Mprobe(MPI_ANY_SOURCE, 600 + (int) i, MPI_COMM_WORLD, &m, &st);
            MPI_Get_count(&st, MPI_BYTE, &count);
            CHECK(st.MPI_SOURCE == peer && (size_t) count == len, "mprobe: source %d count %d", st.MPI_SOURCE, count);
            memset(b, 0, len);
            MPI_Mrecv(b, count, MPI_BYTE, &m, &st);
            CHECK(m == MPI_MESSAGE_NULL && wrong(b, peer, len) < 0, "mrecv of %zu", len);
            flag = 0;
            while (!flag) MPI_Improbe(peer, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &m, &st);
            MPI_Get_count(&st, MPI_BYTE, &count);
            CHECK(st.MPI_TAG == 700 + (int) i && (size_t) count == len, "improbe: tag %d count %d", st.MPI_TAG, count);
            memset(b, 0, len);
            MPI_Imrecv(b, count, MPI_BYTE, &m, &q);
            MPI_Wait(&q, &st);
            CHECK(st.MPI_SOURCE == peer && wrong(b, peer, len) < 0, "imrecv of %zu", len);
        }
        free(b);
    }
    passed("sync");
}

/* Non-contiguous datatypes: strided vectors, indexed blocks and a struct
 * with holes, up to 4 MiB of data; sent as the type, received contiguous
 * and as the type. */
static void test_dtype(void)
{
    for (int blocks = 1; blocks <= (1 << 14); blocks *= 4) {
        const int blen = 64, stride = 96;
        MPI_Datatype vec, idx, st;
        size_t span = (size_t) blocks * stride * sizeof(int);
        int *src = malloc(span), *dst = malloc(span), *flat = malloc((size_t) blocks * blen * sizeof(int));
        MPI_Type_vector(blocks, blen, stride, MPI_INT, &vec);
        MPI_Type_commit(&vec);
        for (size_t k = 0; k < span / sizeof(int); k++) src[k] = (int) (rank * 1000003 + k);
        /* As the type to contiguous, and back as the type. */
        if (rank < peer) {
            MPI_Send(src, 1, vec, peer, 1, MPI_COMM_WORLD);
            memset(dst, 0xff, span);
            MPI_Recv(dst, 1, vec, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(flat, blocks * blen, MPI_INT, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            for (int b = 0; b < blocks; b++)
                for (int j = 0; j < blen; j++)
                    CHECK(flat[b * blen + j] == peer * 1000003 + b * stride + j, "vector block %d word %d", b, j);
            MPI_Send(src, 1, vec, peer, 2, MPI_COMM_WORLD);
        }
        if (rank < peer) {
            for (int b = 0; b < blocks; b++)
                for (int j = 0; j < stride; j++) {
                    int want = j < blen ? peer * 1000003 + b * stride + j : -1;
                    CHECK(dst[b * stride + j] == want, "vector back: block %d word %d", b, j);
                }
        }
        /* Indexed: growing blocks at growing displacements. */
        {
            int n = blocks < 64 ? blocks : 64, lens[64], disps[64], total = 0, at = 0;
            for (int k = 0; k < n; k++) {
                lens[k] = k + 1;
                disps[k] = at;
                at += 2 * (k + 1);
                total += k + 1;
            }
            MPI_Type_indexed(n, lens, disps, MPI_INT, &idx);
            MPI_Type_commit(&idx);
            memset(dst, 0, span);
            MPI_Sendrecv(src, 1, idx, peer, 3, flat, total, MPI_INT, peer, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            for (int k = 0, f = 0; k < n; k++)
                for (int j = 0; j < lens[k]; j++, f++)
                    CHECK(flat[f] == peer * 1000003 + disps[k] + j, "indexed block %d word %d", k, j);
            MPI_Type_free(&idx);
        }
        /* A struct with a hole: {int, (4 bytes gap), double}. */
        {
            struct rec { int a; double d; } *rs = malloc(sizeof *rs * (size_t) blocks),
                                            *rr = malloc(sizeof *rr * (size_t) blocks);
            int bl[2] = {1, 1};
            MPI_Aint dp[2] = {offsetof(struct rec, a), offsetof(struct rec, d)};
            MPI_Datatype ty[2] = {MPI_INT, MPI_DOUBLE}, tmp;
            MPI_Type_create_struct(2, bl, dp, ty, &tmp);
            MPI_Type_create_resized(tmp, 0, sizeof(struct rec), &st);
            MPI_Type_commit(&st);
            for (int k = 0; k < blocks; k++) {
                rs[k].a = rank + k;
                rs[k].d = rank * 0.5 + k;
            }
            MPI_Sendrecv(rs, blocks, st, peer, 4, rr, blocks, st, peer, 4, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            for (int k = 0; k < blocks; k++)
                CHECK(rr[k].a == peer + k && rr[k].d == peer * 0.5 + k, "struct record %d", k);
            MPI_Type_free(&tmp);
            MPI_Type_free(&st);
            free(rs);
            free(rr);
        }
        MPI_Type_free(&vec);
        free(src);
        free(dst);
        free(flat);
    }
    passed("dtype");
}

/* Bcast, Allreduce, Alltoall, Alltoallv, checked. */
static void test_coll(void)
{
    size_t lens[] = {1, 1000, 65536, 1u << 20};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        for (int root = 0; root < size; root += size > 1 ? size - 1 : 1) {
            size_t len = lens[i];
            unsigned char *b = malloc(len);
            if (rank == root) fill(b, root, len);
            else memset(b, 0, len);
            MPI_Bcast(b, (int) len, MPI_BYTE, root, MPI_COMM_WORLD);
            CHECK(wrong(b, root, len) < 0, "bcast of %zu from %d", len, root);
            free(b);
        }
    }
    for (int n = 1; n <= (1 << 18); n *= 64) {
        long *v = malloc(sizeof(long) * (size_t) n), *sum = malloc(sizeof(long) * (size_t) n);
        double *d = malloc(sizeof(double) * (size_t) n), *mx = malloc(sizeof(double) * (size_t) n);
        for (int k = 0; k < n; k++) {
            v[k] = rank + k;
            d[k] = (double) ((rank * 7 + k) % size);
        }
        MPI_Allreduce(v, sum, n, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(d, mx, n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        for (int k = 0; k < n; k++) {
            long want = (long) size * (size - 1) / 2 + (long) size * k;
            double wmax = 0;
            for (int r = 0; r < size; r++) {
                double x = (double) ((r * 7 + k) % size);
                if (x > wmax) wmax = x;
            }
            CHECK(sum[k] == want && mx[k] == wmax, "allreduce of %d, element %d", n, k);
        }
        free(v); free(sum); free(d); free(mx);
    }
    for (int per = 1; per <= 100000; per *= 100) {
        int *s = malloc(sizeof(int) * (size_t) per * size), *r = malloc(sizeof(int) * (size_t) per * size);
        for (int p = 0; p < size; p++)
            for (int k = 0; k < per; k++) s[p * per + k] = rank * 100000 + p * 1000 + k % 1000;
        MPI_Alltoall(s, per, MPI_INT, r, per, MPI_INT, MPI_COMM_WORLD);
        for (int p = 0; p < size; p++)
            for (int k = 0; k < per; k++)
                CHECK(r[p * per + k] == p * 100000 + rank * 1000 + k % 1000, "alltoall %d from %d item %d", per, p, k);
        free(s);
        free(r);
    }
    {
        /* Rank r sends (r + p) % 5 * 1000 + 1 ints to rank p. */
        int *sc = malloc(sizeof(int) * size), *sd = malloc(sizeof(int) * size), *rc = malloc(sizeof(int) * size),
            *rd = malloc(sizeof(int) * size), st = 0, rt = 0;
        for (int p = 0; p < size; p++) {
            sc[p] = (rank + p) % 5 * 1000 + 1;
            rc[p] = (p + rank) % 5 * 1000 + 1;
            sd[p] = st;
            rd[p] = rt;
            st += sc[p];
            rt += rc[p];
        }
        int *s = malloc(sizeof(int) * (size_t) st), *r = malloc(sizeof(int) * (size_t) rt);
        for (int p = 0; p < size; p++)
            for (int k = 0; k < sc[p]; k++) s[sd[p] + k] = rank * 7919 + p * 31 + k;
        MPI_Alltoallv(s, sc, sd, MPI_INT, r, rc, rd, MPI_INT, MPI_COMM_WORLD);
        for (int p = 0; p < size; p++)
            for (int k = 0; k < rc[p]; k++)
                CHECK(r[rd[p] + k] == p * 7919 + rank * 31 + k, "alltoallv from %d item %d", p, k);
        free(s); free(r); free(sc); free(sd); free(rc); free(rd);
    }
    passed("coll");
}

/* Two threads per rank, each with its own communicator, exchanging at
 * once (MPI_THREAD_MULTIPLE). */
struct thread_arg {
    MPI_Comm comm;
    int id;
    int bad;
};

static void *exchange(void *p)
{
    struct thread_arg *a = p;
    for (int it = 0; it < 40; it++) {
        size_t len = (size_t) 1 << (it % 18);
        unsigned char *s = malloc(len), *r = malloc(len);
        MPI_Request q[2];
        fill(s, rank * 10 + a->id, len);
        MPI_Irecv(r, (int) len, MPI_BYTE, peer, it, a->comm, &q[0]);
        MPI_Isend(s, (int) len, MPI_BYTE, peer, it, a->comm, &q[1]);
        MPI_Waitall(2, q, MPI_STATUSES_IGNORE);
        if (wrong(r, peer * 10 + a->id, len) >= 0) a->bad++;
        free(s);
        free(r);
    }
    return NULL;
}

static void test_threads(int provided)
{
    pthread_t t[2];
    struct thread_arg a[2];
    CHECK(provided == MPI_THREAD_MULTIPLE, "MPI_THREAD_MULTIPLE not provided (%d)", provided);
    for (int i = 0; i < 2; i++) {
        MPI_Comm_dup(MPI_COMM_WORLD, &a[i].comm);
        a[i].id = i;
        a[i].bad = 0;
    }
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, exchange, &a[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++) {
        CHECK(a[i].bad == 0, "thread %d: %d messages wrong", i, a[i].bad);
        MPI_Comm_free(&a[i].comm);
    }
    passed("threads");
}

/* One-sided: windows from MPI_Win_allocate and MPI_Win_create; Put, Get,
 * Accumulate, Fetch_and_op, Compare_and_swap; fence, lock and lock_all
 * epochs with flush. */
static void rma_on(MPI_Win win, long *base, const char *kind)
{
    const int n = 1024;
    long buf[1024], one = 1, old, cmp, mine;

    /* Fence: each rank puts into its pair's window, then gets it back. */
    MPI_Win_fence(0, win);
    for (int k = 0; k < n; k++) buf[k] = rank * 100000 + k;
    MPI_Put(buf, n, MPI_LONG, peer, 0, n, MPI_LONG, win);
    MPI_Win_fence(0, win);
    for (int k = 0; k < n; k++) CHECK(base[k] == peer * 100000 + k, "%s: put landed wrong at %d", kind, k);
    memset(buf, 0, sizeof buf);
    MPI_Get(buf, n, MPI_LONG, peer, 0, n, MPI_LONG, win);
    MPI_Win_fence(0, win);
    for (int k = 0; k < n; k++) CHECK(buf[k] == rank * 100000 + k, "%s: get wrong at %d", kind, k);

    /* Accumulate from every rank into rank 0. */
    if (0 == rank) memset(base, 0, n * sizeof(long));
    MPI_Win_fence(0, win);
    for (int k = 0; k < n; k++) buf[k] = rank + k;
    MPI_Accumulate(buf, n, MPI_LONG, 0, 0, n, MPI_LONG, MPI_SUM, win);
    MPI_Win_fence(0, win);
    if (0 == rank)
        for (int k = 0; k < n; k++)
            CHECK(base[k] == (long) size * (size - 1) / 2 + (long) size * k, "%s: accumulate at %d", kind, k);

    /* Fetch_and_op on one counter from every rank, 50 times each, in a
     * passive-target epoch: every value is seen once. */
    if (0 == rank) base[n] = 0;
    MPI_Win_fence(0, win);
    {
        long seen[50];
        long *all = malloc(sizeof(long) * 50 * (size_t) size);
        MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
        for (int it = 0; it < 50; it++) {
            MPI_Fetch_and_op(&one, &seen[it], MPI_LONG, 0, n, MPI_SUM, win);
            MPI_Win_flush(0, win);
        }
        MPI_Win_unlock(0, win);
        MPI_Allgather(seen, 50, MPI_LONG, all, 50, MPI_LONG, MPI_COMM_WORLD);
        if (0 == rank) {
            char *hit = calloc((size_t) 50 * size, 1);
            for (int k = 0; k < 50 * size; k++) {
                CHECK(all[k] >= 0 && all[k] < 50 * size && !hit[all[k]], "%s: fetch_and_op value %ld", kind, all[k]);
                hit[all[k]] = 1;
            }
            free(hit);
        }
        free(all);
    }
    MPI_Win_fence(0, win);
    if (0 == rank) CHECK(base[n] == 50L * size, "%s: counter %ld", kind, base[n]);

    /* Compare_and_swap: exactly one rank wins each round (rounds enough
     * for the ranks' swaps to meet). */
    for (int round = 0; round < 20; round++) {
        if (0 == rank) base[n + 1] = -1;
        MPI_Win_fence(0, win);
        cmp = -1;
        mine = rank;
        MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
        MPI_Compare_and_swap(&mine, &cmp, &old, MPI_LONG, 0, n + 1, win);
        MPI_Win_unlock(0, win);
        {
            int won = old == -1, winners;
            MPI_Allreduce(&won, &winners, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
            CHECK(winners == 1, "%s: %d ranks won compare_and_swap", kind, winners);
        }
        MPI_Win_fence(0, win);
    }

    /* Exclusive lock epochs: every rank adds to its pair's word in turn. */
    MPI_Win_fence(0, win);
    base[n + 2] = 0;
    MPI_Win_fence(0, win);
    for (int it = 0; it < 10; it++) {
        long v;
        MPI_Win_lock(MPI_LOCK_EXCLUSIVE, peer, 0, win);
        MPI_Get(&v, 1, MPI_LONG, peer, n + 2, 1, MPI_LONG, win);
        MPI_Win_flush(peer, win);
        v += 1;
        MPI_Put(&v, 1, MPI_LONG, peer, n + 2, 1, MPI_LONG, win);
        MPI_Win_unlock(peer, win);
    }
    MPI_Win_fence(0, win);
    CHECK(base[n + 2] == 10, "%s: exclusive epochs lost updates: %ld", kind, base[n + 2]);

    /* lock_all with flush_all. */
    MPI_Win_lock_all(0, win);
    for (int k = 0; k < 16; k++) buf[k] = rank * 7 + k;
    MPI_Put(buf, 16, MPI_LONG, peer, n + 8, 16, MPI_LONG, win);
    MPI_Win_flush_all(win);
    MPI_Win_unlock_all(win);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_lock_all(0, win);
    MPI_Win_sync(win);
    for (int k = 0; k < 16; k++) CHECK(base[n + 8 + k] == peer * 7 + k, "%s: lock_all put at %d", kind, k);
    MPI_Win_unlock_all(win);
    MPI_Barrier(MPI_COMM_WORLD);
}

static void test_rma(void)
{
    const MPI_Aint bytes = (1024 + 64) * sizeof(long);
    MPI_Win win;
    long *base;
    MPI_Win_allocate(bytes, sizeof(long), MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
    memset(base, 0, (size_t) bytes);
    rma_on(win, base, "Win_allocate");
    MPI_Win_free(&win);

    base = malloc((size_t) bytes);
    memset(base, 0, (size_t) bytes);
    MPI_Win_create(base, bytes, sizeof(long), MPI_INFO_NULL, MPI_COMM_WORLD, &win);
    rma_on(win, base, "Win_create");
    MPI_Win_free(&win);
    free(base);
    passed("rma");
}

/* Rank 1 dies with SIGKILL in the middle of traffic; the others keep
 * sending to it. The job must end (with a message naming the dead rank),
 * not hang: this test never passes. */
static void test_kill(void)
{
    const size_t len = 1u << 20;
    unsigned char *b = malloc(len);
    fill(b, rank, len);
    MPI_Barrier(MPI_COMM_WORLD);
    if (1 == rank) {
        fprintf(stderr, "rank 1: killing myself\n");
        raise(SIGKILL);
    }
    for (int it = 0; it < 1000000; it++) {
        if (peer == 1) {
            MPI_Send(b, (int) len, MPI_BYTE, 1, 5, MPI_COMM_WORLD);
        } else {
            MPI_Barrier(MPI_COMM_WORLD);
        }
    }
    free(b);
}

/* After MPI_Finalize: the component has released everything. No thread of
 * xrcbtl's is left (Open MPI unloads the component), and the kernel holds no
 * verbs object of this process but librdmacm's own (`rdma resource show`,
 * where the tool exists). Prints "released: rank N" or why not, and returns
 * 0 if so. */
static int check_released(int me)
{
    int bad = 0;
    char path[64], name[64], cmd[128], line[512];
    DIR *tasks = opendir("/proc/self/task");
    struct dirent *t;
    while (tasks && (t = readdir(tasks))) {
        FILE *f;
        snprintf(path, sizeof path, "/proc/self/task/%.16s/comm", t->d_name);
        if (NULL == (f = fopen(path, "r"))) continue;
        if (fgets(name, sizeof name, f) && !strncmp(name, "xrcbtl", 6)) {
            fprintf(stderr, "rank %d: thread %s (%.*s) outlived MPI_Finalize\n", me, t->d_name, (int) strcspn(name, "\n"), name);
            bad = 1;
        }
        fclose(f);
    }
    if (tasks) closedir(tasks);
    if (0 == system("command -v rdma >/dev/null 2>&1")) {
        /* librdmacm keeps the device contexts it opened, each with one
         * protection domain of its own and nothing in it, until the process
         * ends: at most one unused PD per context may remain. Anything else
         * (a QP, CQ, MR, CM id, or a PD in use or beyond that) is ours. */
        const char *kinds[] = {"qp", "cq", "mr", "cm_id", "pd", "ctx"};
        int pds = 0, ctxs = 0;
        for (int k = 0; k < 6; k++) {
            FILE *p;
            snprintf(cmd, sizeof cmd, "rdma resource show %s pid %d 2>/dev/null", kinds[k], (int) getpid());
            if (NULL == (p = popen(cmd, "r"))) continue;
            while (fgets(line, sizeof line, p)) {
                if (strspn(line, " \n") == strlen(line)) continue;
                if (!strcmp(kinds[k], "ctx")) {
                    ctxs++;
                    continue;
                }
                if (!strcmp(kinds[k], "pd") && strstr(line, " users 0 ")) {
                    pds++;
                    continue;
                }
                fprintf(stderr, "rank %d: still held after MPI_Finalize: %s", me, line);
                bad = 1;
            }
            pclose(p);
        }
        if (pds > ctxs) {
            fprintf(stderr, "rank %d: %d unused PDs left for %d device contexts\n", me, pds, ctxs);
            bad = 1;
        }
    }
    if (!bad) printf("released: rank %d\n", me);
    fflush(stdout);
    return bad;
}

int main(int argc, char **argv)
{
    int provided = test_start(&argc, &argv, "xrc_mpi_test");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "p2p")) test_p2p();
        else if (!strcmp(argv[i], "sync")) test_sync();
        else if (!strcmp(argv[i], "dtype")) test_dtype();
        else if (!strcmp(argv[i], "coll")) test_coll();
        else if (!strcmp(argv[i], "threads")) test_threads(provided);
        else if (!strcmp(argv[i], "rma")) test_rma();
        else if (!strcmp(argv[i], "kill")) test_kill();
        else {
            if (0 == rank) fprintf(stderr, "unknown test %s\n", argv[i]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    MPI_Finalize();
    return check_released(rank);
}
