/*
 * One-sided MPI, every result checked against a reference computed locally.
 * Run under mpirun over the BTL under test (scripts/guest-ompi does, with
 * --mca pml ob1 --mca btl self,xrc; osc/rdma on rxe, osc/pt2pt on siw):
 *
 *   xrc_rma_test [eager=BYTES] TEST...     ops contend threads
 *
 * ops      MPI_Accumulate, MPI_Get_accumulate, MPI_Fetch_and_op and
 *          MPI_Compare_and_swap with every predefined operation (MPI_REPLACE,
 *          MPI_NO_OP, MPI_MAXLOC and MPI_MINLOC included) on the basic
 *          datatypes, with counts 1, 2, 7, 1,024, 65,536 and one element
 *          past the eager limit (eager=BYTES, default 8192: Open MPI's
 *          btl_xrc_eager_limit), on windows from MPI_Win_allocate,
 *          MPI_Win_create and MPI_Win_create_dynamic, under fence,
 *          lock/unlock, lock_all with flush_local and flush, and
 *          post-start-complete-wait. Each rank works on its pair's window
 *          (ranks pair up as r and r^1); every (operation, datatype) meets
 *          every count across the windows and epochs.
 * contend  every rank at once on rank 0's words: MPI_Get_accumulate and
 *          MPI_Fetch_and_op adding 1 (each value fetched once), and
 *          MPI_Accumulate summing whole arrays.
 * threads  two threads at once under MPI_THREAD_MULTIPLE, each on an
 *          MPI_Win_create window of its own: the ops matrix under lock and
 *          lock_all, then contend.
 *
 * Any even number of ranks. Rank 0 prints "PASS test" once every rank
 * passed it, and a line of what was checked; the first failure aborts the
 * job with its reason.
 */
#define _GNU_SOURCE
#include "mpi_test.h"
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t eager = 8192;


/* ---- the operations and their reference ------------------------------- */

struct op {
    MPI_Op op;
    const char *name;
    int ints_only;  /* logical and bitwise: C integer types only */
    int fetch_only; /* MPI_NO_OP: Get_accumulate and Fetch_and_op only */
};

static const struct op ops[] = {
    {MPI_SUM, "SUM", 0, 0},   {MPI_PROD, "PROD", 0, 0}, {MPI_MAX, "MAX", 0, 0},
    {MPI_MIN, "MIN", 0, 0},   {MPI_LAND, "LAND", 1, 0}, {MPI_LOR, "LOR", 1, 0},
    {MPI_LXOR, "LXOR", 1, 0}, {MPI_BAND, "BAND", 1, 0}, {MPI_BOR, "BOR", 1, 0},
    {MPI_BXOR, "BXOR", 1, 0}, {MPI_REPLACE, "REPLACE", 0, 0}, {MPI_NO_OP, "NO_OP", 0, 1},
};
#define NOPS ((int) (sizeof ops / sizeof ops[0]))

/* The value an op leaves in the target: the target's t combined with the
 * origin's o (every predefined operation is commutative). */
#define APPLY_COMMON(op, t, o)                   \
    if ((op) == MPI_SUM) return (t) + (o);       \
    if ((op) == MPI_PROD) return (t) * (o);      \
    if ((op) == MPI_MAX) return (t) > (o) ? (t) : (o); \
    if ((op) == MPI_MIN) return (t) < (o) ? (t) : (o); \
    if ((op) == MPI_REPLACE) return (o);         \
    if ((op) == MPI_NO_OP) return (t);

#define INT_TYPE(T, N)                                                                   \
    static T apply_##N(MPI_Op op, T t, T o)                                              \
    {                                                                                    \
        APPLY_COMMON(op, t, o)                                                           \
        if (op == MPI_LAND) return (T) (t && o);                                         \
        if (op == MPI_LOR) return (T) (t || o);                                          \
        if (op == MPI_LXOR) return (T) (!t != !o);                                       \
        if (op == MPI_BAND) return (T) (t & o);                                          \
        if (op == MPI_BOR) return (T) (t | o);                                           \
        if (op == MPI_BXOR) return (T) (t ^ o);                                          \
        abort();                                                                         \
    }                                                                                    \
    TYPE_FNS(T, N)

#define FLOAT_TYPE(T, N)                                                                 \
    static T apply_##N(MPI_Op op, T t, T o)                                              \
    {                                                                                    \
        APPLY_COMMON(op, t, o)                                                           \
        abort();                                                                         \
    }                                                                                    \
    TYPE_FNS(T, N)

#define TYPE_FNS(T, N)                                                                   \
    static void set_##N(void *b, size_t i, long v) { ((T *) b)[i] = (T) v; }             \
    static double get_##N(const void *b, size_t i) { return (double) ((const T *) b)[i]; } \
    static void ref_##N(MPI_Op op, void *t, const void *o, size_t n)                     \
    {                                                                                    \
        T *x = t;                                                                        \
        const T *y = o;                                                                  \
        for (size_t i = 0; i < n; i++) x[i] = apply_##N(op, x[i], y[i]);                 \
    }

INT_TYPE(signed char, schar)
INT_TYPE(unsigned char, uchar)
INT_TYPE(short, short)
INT_TYPE(int, int)
INT_TYPE(unsigned, unsigned)
INT_TYPE(long, long)
INT_TYPE(unsigned long, ulong)
INT_TYPE(long long, llong)
INT_TYPE(int32_t, int32)
INT_TYPE(uint64_t, uint64)
FLOAT_TYPE(float, float)
FLOAT_TYPE(double, double)

struct type {
    MPI_Datatype dt;
    const char *name;
    size_t size;
    int is_int;
    void (*set)(void *, size_t, long);
    double (*get)(const void *, size_t);
    void (*ref)(MPI_Op, void *, const void *, size_t);
};

#define T(dt, c, n, isint) {dt, #dt, sizeof(c), isint, set_##n, get_##n, ref_##n}
static const struct type types[] = {
    T(MPI_SIGNED_CHAR, signed char, schar, 1), T(MPI_UNSIGNED_CHAR, unsigned char, uchar, 1),
    T(MPI_SHORT, short, short, 1),             T(MPI_INT, int, int, 1),
    T(MPI_UNSIGNED, unsigned, unsigned, 1),    T(MPI_LONG, long, long, 1),
    T(MPI_UNSIGNED_LONG, unsigned long, ulong, 1), T(MPI_LONG_LONG, long long, llong, 1),
    T(MPI_INT32_T, int32_t, int32, 1),         T(MPI_UINT64_T, uint64_t, uint64, 1),
    T(MPI_FLOAT, float, float, 0),             T(MPI_DOUBLE, double, double, 0),
};
#define NTYPES ((int) (sizeof types / sizeof types[0]))

/* Values small and non-negative enough that no operation overflows the
 * narrowest type (Open MPI 4.1's op/avx saturates an 8- or 16-bit sum that
 * overflows, open-mpi/ompi#8045, and compares unsigned values with the top
 * bit set wrongly, #10648: a test of the transport steers clear), with zeros
 * among them for the logical operations, different on each rank and element. */
static long target_value(int r, size_t i) { return (long) ((i * 7 + (size_t) r * 3) % 5) * ((i % 3) != 0) + (i % 11 == 0); }
static long origin_value(int r, size_t i) { return (long) ((i * 5 + (size_t) r) % 4) + ((i % 4) == 1); }

/* The first element where a and b differ (bit for bit), or -1. */
static long differs(const struct type *t, const void *a, const void *b, size_t n)
{
    const unsigned char *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (memcmp(x + i * t->size, y + i * t->size, t->size)) return (long) i;
    return -1;
}

/* ---- windows and epochs ------------------------------------------------ */

enum win_kind { W_ALLOCATE, W_CREATE, W_DYNAMIC, NWIN };
static const char *win_name[NWIN] = {"Win_allocate", "Win_create", "Win_create_dynamic"};
enum sync_kind { S_FENCE, S_LOCK, S_LOCK_ALL, S_PSCW, NSYNC };
static const char *sync_name[NSYNC] = {"fence", "lock", "lock_all/flush", "pscw"};

/* A window of `bytes` in which the ops work at displacement `disp` of the
 * pair's window (the peer's attached address, for a dynamic window). */
struct win {
    MPI_Win win;
    MPI_Comm comm;
    enum win_kind kind;
    unsigned char *base;
    MPI_Aint disp; /* where the peer's memory starts, as the peer's window addresses it */
    MPI_Group pair;
    int me, other;
};

static void win_open(struct win *w, enum win_kind kind, MPI_Comm comm, size_t bytes)
{
    MPI_Group all;
    w->kind = kind;
    w->comm = comm;
    MPI_Comm_rank(comm, &w->me);
    w->other = w->me ^ 1;
    w->disp = 0;
    switch (kind) {
    case W_ALLOCATE:
        MPI_Win_allocate((MPI_Aint) bytes, 1, MPI_INFO_NULL, comm, &w->base, &w->win);
        break;
    case W_CREATE:
        w->base = malloc(bytes);
        CHECK(w->base, "malloc %zu", bytes);
        MPI_Win_create(w->base, (MPI_Aint) bytes, 1, MPI_INFO_NULL, comm, &w->win);
        break;
    default: {
        MPI_Aint mine;
        w->base = malloc(bytes);
        CHECK(w->base, "malloc %zu", bytes);
        MPI_Win_create_dynamic(MPI_INFO_NULL, comm, &w->win);
        MPI_Win_attach(w->win, w->base, (MPI_Aint) bytes);
        MPI_Get_address(w->base, &mine);
        MPI_Sendrecv(&mine, 1, MPI_AINT, w->other, 7, &w->disp, 1, MPI_AINT, w->other, 7, comm,
                     MPI_STATUS_IGNORE);
    }
    }
    memset(w->base, 0, bytes);
    MPI_Comm_group(comm, &all);
    MPI_Group_incl(all, 1, &w->other, &w->pair);
    MPI_Group_free(&all);
    MPI_Barrier(comm);
}

static void win_close(struct win *w)
{
    MPI_Group_free(&w->pair);
    if (w->kind == W_DYNAMIC) MPI_Win_detach(w->win, w->base);
    MPI_Win_free(&w->win);
    if (w->kind != W_ALLOCATE) free(w->base);
}

/* Before an epoch: this rank's memory holds what the pair's operation will
 * meet, written in an epoch of its own where the memory model asks for one. */
static void prepare(struct win *w, enum sync_kind s, void (*init)(void *, void *), void *arg)
{
    if (s == S_LOCK || s == S_LOCK_ALL) {
        MPI_Win_lock(MPI_LOCK_EXCLUSIVE, w->me, 0, w->win);
        init(w->base, arg);
        MPI_Win_unlock(w->me, w->win);
        MPI_Barrier(w->comm);
    } else {
        init(w->base, arg);
        if (s == S_FENCE) MPI_Win_fence(MPI_MODE_NOPRECEDE, w->win);
        else MPI_Barrier(w->comm);
    }
    if (s == S_LOCK) MPI_Win_lock(MPI_LOCK_EXCLUSIVE, w->other, 0, w->win);
    if (s == S_LOCK_ALL) MPI_Win_lock_all(0, w->win);
    if (s == S_PSCW) {
        MPI_Win_post(w->pair, 0, w->win);
        MPI_Win_start(w->pair, 0, w->win);
    }
}

/* Ends the epoch; then this rank's memory shows what the pair did to it. */
static void conclude(struct win *w, enum sync_kind s)
{
    switch (s) {
    case S_FENCE:
        MPI_Win_fence(MPI_MODE_NOSUCCEED, w->win);
        break;
    case S_LOCK:
        MPI_Win_unlock(w->other, w->win);
        break;
    case S_LOCK_ALL:
        MPI_Win_flush_local(w->other, w->win);
        MPI_Win_flush(w->other, w->win);
        MPI_Win_unlock_all(w->win);
        break;
    default:
        MPI_Win_complete(w->win);
        MPI_Win_wait(w->win);
    }
    if (s == S_LOCK || s == S_LOCK_ALL) {
        MPI_Barrier(w->comm);
        MPI_Win_lock(MPI_LOCK_EXCLUSIVE, w->me, 0, w->win);
        MPI_Win_unlock(w->me, w->win);
    }
}

/* ---- the ops matrix ----------------------------------------------------- */

struct counts {
    long accumulate, get_accumulate, fetch_and_op, compare_and_swap, maxloc, elements;
};

struct job {
    const struct type *t;
    size_t n;
    int r; /* whose values: the target's rank */
};

static void init_target(void *base, void *arg)
{
    struct job *j = arg;
    for (size_t i = 0; i < j->n; i++) j->t->set(base, i, target_value(j->r, i));
}

static size_t count_of(int k, const struct type *t)
{
    static const size_t fixed[] = {1, 2, 7, 1024, 65536};
    return k < 5 ? fixed[k] : eager / t->size + 1;
}
#define NCOUNTS 6

/* Accumulate (or Get_accumulate) of n elements with op into the pair's
 * window; checks the pair's result in this rank's memory, and the fetched
 * values. */
static void one_accumulate(struct win *w, enum sync_kind s, const struct op *o, const struct type *t,
                           size_t n, int fetch, unsigned char *scratch, struct counts *c)
{
    size_t bytes = n * t->size;
    unsigned char *origin = scratch, *result = scratch + bytes, *want = scratch + 2 * bytes;
    struct job mine = {t, n, w->me};
    long bad;
    for (size_t i = 0; i < n; i++) t->set(origin, i, origin_value(w->me, i));
    memset(result, 0xa5, bytes);
    prepare(w, s, init_target, &mine);
    if (fetch)
        MPI_Get_accumulate(origin, (int) n, t->dt, result, (int) n, t->dt, w->other, w->disp, (int) n,
                           t->dt, o->op, w->win);
    else
        MPI_Accumulate(origin, (int) n, t->dt, w->other, w->disp, (int) n, t->dt, o->op, w->win);
    conclude(w, s);
    /* What the pair did to this rank's memory. */
    for (size_t i = 0; i < n; i++) {
        t->set(want, i, target_value(w->me, i));
        t->set(origin, i, origin_value(w->other, i));
    }
    t->ref(o->op, want, origin, n);
    bad = differs(t, w->base, want, n);
    CHECK(bad < 0, "%s %s %s %s x%zu under %s: element %ld is %g, expected %g",
          fetch ? "Get_accumulate" : "Accumulate", o->name, t->name, win_name[w->kind], n,
          sync_name[s], bad, t->get(w->base, (size_t) bad), t->get(want, (size_t) bad));
    if (fetch) {
        /* The values fetched: the pair's memory before the operation. */
        for (size_t i = 0; i < n; i++) t->set(want, i, target_value(w->other, i));
        bad = differs(t, result, want, n);
        CHECK(bad < 0, "Get_accumulate %s %s %s x%zu under %s: fetched element %ld is %g, expected %g",
              o->name, t->name, win_name[w->kind], n, sync_name[s], bad, t->get(result, (size_t) bad),
              t->get(want, (size_t) bad));
        c->get_accumulate++;
    } else {
        c->accumulate++;
    }
    c->elements += (long) n;
}

static void one_fetch_and_op(struct win *w, enum sync_kind s, const struct op *o, const struct type *t,
                             unsigned char *scratch, struct counts *c)
{
    unsigned char *origin = scratch, *result = scratch + 16, *want = scratch + 32;
    /* The element at index 1 (a nonzero value for the logical operations). */
    const size_t at = 1;
    t->set(origin, 0, origin_value(w->me, at));
    memset(result, 0xa5, 16);
    prepare(w, s, init_target, &(struct job){t, at + 1, w->me});
    MPI_Fetch_and_op(origin, result, t->dt, w->other, w->disp + (MPI_Aint) (at * t->size), o->op, w->win);
    conclude(w, s);
    t->set(want, 0, target_value(w->me, at));
    t->set(origin, 0, origin_value(w->other, at));
    t->ref(o->op, want, origin, 1);
    CHECK(t->get(w->base, at) == t->get(want, 0), "Fetch_and_op %s %s %s under %s: left %g, expected %g",
          o->name, t->name, win_name[w->kind], sync_name[s], t->get(w->base, at), t->get(want, 0));
    CHECK(t->get(result, 0) == (double) target_value(w->other, at),
          "Fetch_and_op %s %s %s under %s: fetched %g, expected %ld", o->name, t->name, win_name[w->kind],
          sync_name[s], t->get(result, 0), target_value(w->other, at));
    c->fetch_and_op++;
}

/* Compare_and_swap at element 2, once with the value there (it swaps) and
 * once with another (it does not). */
static void one_compare_and_swap(struct win *w, enum sync_kind s, const struct type *t, int hit,
                                 unsigned char *scratch, struct counts *c)
{
    unsigned char *origin = scratch, *compare = scratch + 16, *result = scratch + 32;
    const size_t at = 2;
    long before_mine = target_value(w->me, at), before_theirs = target_value(w->other, at);
    t->set(origin, 0, 100 + w->me);
    t->set(compare, 0, hit ? before_theirs : before_theirs + 1);
    memset(result, 0xa5, 16);
    prepare(w, s, init_target, &(struct job){t, at + 1, w->me});
    MPI_Compare_and_swap(origin, compare, result, t->dt, w->other, w->disp + (MPI_Aint) (at * t->size),
                         w->win);
    conclude(w, s);
    CHECK(t->get(w->base, at) == (double) (hit ? 100 + w->other : before_mine),
          "Compare_and_swap %s %s under %s (%s): left %g", t->name, win_name[w->kind], sync_name[s],
          hit ? "equal" : "different", t->get(w->base, at));
    CHECK(t->get(result, 0) == (double) before_theirs, "Compare_and_swap %s %s under %s: fetched %g, expected %ld",
          t->name, win_name[w->kind], sync_name[s], t->get(result, 0), before_theirs);
    c->compare_and_swap++;
}

/* MPI_MAXLOC and MPI_MINLOC on MPI_2INT, by Accumulate and Get_accumulate. */
static void one_loc(struct win *w, enum sync_kind s, int max, int fetch, struct counts *c)
{
    enum { N = 7 };
    int origin[2 * N], result[2 * N];
    struct job mine = {&types[3], 2 * N, w->me};
    for (int i = 0; i < N; i++) {
        origin[2 * i] = (int) origin_value(w->me, (size_t) i);
        origin[2 * i + 1] = 1000 + w->me;
    }
    prepare(w, s, init_target, &mine);
    if (fetch)
        MPI_Get_accumulate(origin, N, MPI_2INT, result, N, MPI_2INT, w->other, w->disp, N, MPI_2INT,
                           max ? MPI_MAXLOC : MPI_MINLOC, w->win);
    else
        MPI_Accumulate(origin, N, MPI_2INT, w->other, w->disp, N, MPI_2INT, max ? MPI_MAXLOC : MPI_MINLOC,
                       w->win);
    conclude(w, s);
    for (int i = 0; i < N; i++) {
        int tv = (int) target_value(w->me, (size_t) (2 * i)), ti = (int) target_value(w->me, (size_t) (2 * i + 1));
        int ov = (int) origin_value(w->other, (size_t) i), oi = 1000 + w->other;
        int v = tv, ix = ti;
        if ((max && ov > tv) || (!max && ov < tv)) v = ov, ix = oi;
        else if (ov == tv) ix = oi < ti ? oi : ti;
        int *got = (int *) w->base;
        CHECK(got[2 * i] == v && got[2 * i + 1] == ix, "%s %s %s under %s: pair %d is (%d, %d), expected (%d, %d)",
              fetch ? "Get_accumulate" : "Accumulate", max ? "MAXLOC" : "MINLOC", win_name[w->kind],
              sync_name[s], i, got[2 * i], got[2 * i + 1], v, ix);
        if (fetch)
            CHECK(result[2 * i] == (int) target_value(w->other, (size_t) (2 * i)) &&
                      result[2 * i + 1] == (int) target_value(w->other, (size_t) (2 * i + 1)),
                  "Get_accumulate %s: fetched pair %d wrong", max ? "MAXLOC" : "MINLOC", i);
    }
    c->maxloc++;
}

/* The whole matrix on one window under one epoch kind. `turn` shifts which
 * count each (operation, datatype) gets, so that over the window and epoch
 * kinds every pair meets every count. */
static void matrix(struct win *w, enum sync_kind s, int turn, unsigned char *scratch, struct counts *c)
{
    for (int oi = 0; oi < NOPS; oi++) {
        for (int ti = 0; ti < NTYPES; ti++) {
            const struct op *o = &ops[oi];
            const struct type *t = &types[ti];
            if (o->ints_only && !t->is_int) continue;
            if (!o->fetch_only) one_accumulate(w, s, o, t, count_of((oi + ti + turn) % NCOUNTS, t), 0, scratch, c);
            one_accumulate(w, s, o, t, count_of((oi + ti + turn + 3) % NCOUNTS, t), 1, scratch, c);
            one_fetch_and_op(w, s, o, t, scratch, c);
        }
    }
    for (int ti = 0; ti < NTYPES; ti++)
        if (types[ti].is_int) {
            one_compare_and_swap(w, s, &types[ti], 1, scratch, c);
            one_compare_and_swap(w, s, &types[ti], 0, scratch, c);
        }
    for (int max = 0; max < 2; max++)
        for (int fetch = 0; fetch < 2; fetch++) one_loc(w, s, max, fetch, c);
}

/* Bytes a window and the scratch need: the largest count of the widest type. */
static size_t largest(void)
{
    size_t most = 65536 * sizeof(uint64_t);
    size_t past = (eager / sizeof(uint64_t) + 1) * sizeof(uint64_t);
    if (past > most) most = past;
    for (int i = 0; i < NTYPES; i++)
        if ((eager / types[i].size + 1) * types[i].size > most) most = (eager / types[i].size + 1) * types[i].size;
    return most + 64;
}

static void ops_on(MPI_Comm comm, const enum sync_kind *syncs, int nsync, const enum win_kind *wins, int nwin,
                   struct counts *c)
{
    size_t bytes = largest();
    unsigned char *scratch = malloc(3 * bytes);
    CHECK(scratch, "malloc");
    for (int wi = 0; wi < nwin; wi++) {
        struct win w;
        win_open(&w, wins[wi], comm, bytes);
        for (int si = 0; si < nsync; si++) matrix(&w, syncs[si], (int) wins[wi] * NSYNC + (int) syncs[si], scratch, c);
        win_close(&w);
    }
    free(scratch);
}

static void report(const char *name, const struct counts *c)
{
    long all[6], sum[6];
    all[0] = c->accumulate, all[1] = c->get_accumulate, all[2] = c->fetch_and_op;
    all[3] = c->compare_and_swap, all[4] = c->maxloc, all[5] = c->elements;
    MPI_Reduce(all, sum, 6, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (0 == rank)
        printf("%s: checked %ld Accumulate, %ld Get_accumulate, %ld Fetch_and_op, %ld Compare_and_swap, "
               "%ld MAXLOC/MINLOC, %ld elements\n",
               name, sum[0], sum[1], sum[2], sum[3], sum[4], sum[5]);
}


static void test_ops(void)
{
    static const enum sync_kind syncs[] = {S_FENCE, S_LOCK, S_LOCK_ALL, S_PSCW};
    static const enum win_kind wins[] = {W_ALLOCATE, W_CREATE, W_DYNAMIC};
    struct counts c = {0};
    ops_on(MPI_COMM_WORLD, syncs, NSYNC, wins, NWIN, &c);
    report("ops", &c);
    passed("ops");
}

/* Every rank at once on rank 0's window: `rounds` Get_accumulate and
 * Fetch_and_op adding 1 to one word each (every value fetched exactly once
 * across the job), then an Accumulate SUM of a whole array from each. */
static void contend_on(MPI_Comm comm, enum win_kind kind, struct counts *c)
{
    enum { ROUNDS = 40, N = 1024 };
    struct win w;
    int me, n;
    long one = 1, got[2 * ROUNDS], *all, arr[N];
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &n);
    win_open(&w, kind, comm, (N + 8) * sizeof(long));
    MPI_Aint d0;
    /* Rank 0's address: its own for a dynamic window, shared with all. */
    MPI_Get_address(w.base, &d0);
    if (kind != W_DYNAMIC) d0 = 0;
    MPI_Bcast(&d0, 1, MPI_AINT, 0, comm);
    MPI_Win_lock_all(0, w.win);
    for (int i = 0; i < ROUNDS; i++) {
        MPI_Get_accumulate(&one, 1, MPI_LONG, &got[i], 1, MPI_LONG, 0, d0 + (MPI_Aint) (N * sizeof(long)), 1,
                           MPI_LONG, MPI_SUM, w.win);
        MPI_Fetch_and_op(&one, &got[ROUNDS + i], MPI_LONG, 0, d0 + (MPI_Aint) ((N + 1) * sizeof(long)), MPI_SUM,
                         w.win);
        MPI_Win_flush(0, w.win);
    }
    for (int k = 0; k < N; k++) arr[k] = me + k;
    MPI_Accumulate(arr, N, MPI_LONG, 0, d0, N, MPI_LONG, MPI_SUM, w.win);
    MPI_Win_unlock_all(w.win);
    all = malloc(sizeof(long) * 2 * ROUNDS * (size_t) n);
    MPI_Gather(got, 2 * ROUNDS, MPI_LONG, all, 2 * ROUNDS, MPI_LONG, 0, comm);
    MPI_Barrier(comm);
    if (0 == me) {
        char *hit = calloc((size_t) (2 * ROUNDS * n), 1);
        MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, w.win);
        long *b = (long *) w.base;
        for (int k = 0; k < N; k++)
            CHECK(b[k] == (long) n * (n - 1) / 2 + (long) n * k, "contend %s: accumulate at %d: %ld", win_name[kind],
                  k, b[k]);
        CHECK(b[N] == (long) ROUNDS * n && b[N + 1] == (long) ROUNDS * n, "contend %s: counters %ld %ld",
              win_name[kind], b[N], b[N + 1]);
        MPI_Win_unlock(0, w.win);
        for (int r = 0; r < n; r++)
            for (int i = 0; i < 2 * ROUNDS; i++) {
                long v = all[r * 2 * ROUNDS + i];
                int which = i >= ROUNDS;
                CHECK(v >= 0 && v < (long) ROUNDS * n && !hit[which * ROUNDS * n + v],
                      "contend %s: %s fetched %ld twice or out of range", win_name[kind],
                      which ? "Fetch_and_op" : "Get_accumulate", v);
                hit[which * ROUNDS * n + v] = 1;
            }
        free(hit);
    }
    free(all);
    c->get_accumulate += ROUNDS;
    c->fetch_and_op += ROUNDS;
    c->accumulate += 1;
    c->elements += N + 2 * ROUNDS;
    win_close(&w);
}

static void test_contend(void)
{
    struct counts c = {0};
    for (int k = 0; k < NWIN; k++) contend_on(MPI_COMM_WORLD, (enum win_kind) k, &c);
    report("contend", &c);
    passed("contend");
}

struct thread_arg {
    MPI_Comm comm;
    struct counts c;
};

/* On MPI_Win_create windows: the memory of a window from MPI_Win_allocate
 * can be shared between the ranks of a node, and an MPI may then move its
 * data with loads and stores instead of the transport under test. */
static void *thread_main(void *p)
{
    static const enum sync_kind syncs[] = {S_LOCK, S_LOCK_ALL};
    static const enum win_kind wins[] = {W_CREATE};
    struct thread_arg *a = p;
    ops_on(a->comm, syncs, 2, wins, 1, &a->c);
    contend_on(a->comm, W_CREATE, &a->c);
    return NULL;
}

static void test_threads(int provided)
{
    pthread_t t[2];
    struct thread_arg a[2];
    struct counts c = {0};
    CHECK(provided == MPI_THREAD_MULTIPLE, "MPI_THREAD_MULTIPLE not provided (%d)", provided);
    for (int i = 0; i < 2; i++) {
        memset(&a[i].c, 0, sizeof a[i].c);
        MPI_Comm_dup(MPI_COMM_WORLD, &a[i].comm);
    }
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, thread_main, &a[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++) {
        c.accumulate += a[i].c.accumulate, c.get_accumulate += a[i].c.get_accumulate;
        c.fetch_and_op += a[i].c.fetch_and_op, c.compare_and_swap += a[i].c.compare_and_swap;
        c.maxloc += a[i].c.maxloc, c.elements += a[i].c.elements;
        MPI_Comm_free(&a[i].comm);
    }
    report("threads", &c);
    passed("threads");
}

int main(int argc, char **argv)
{
    int provided = test_start(&argc, &argv, "xrc_rma_test");
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "eager=", 6)) {
            char *end;
            unsigned long v = strtoul(argv[i] + 6, &end, 10);
            if (*end || v == 0 || v > (1ul << 24)) {
                if (0 == rank) fprintf(stderr, "eager=%s: not a byte count in 1..16 MiB\n", argv[i] + 6);
                MPI_Abort(MPI_COMM_WORLD, 2);
            }
            eager = v;
        } else if (!strcmp(argv[i], "ops")) test_ops();
        else if (!strcmp(argv[i], "contend")) test_contend();
        else if (!strcmp(argv[i], "threads")) test_threads(provided);
        else {
            if (0 == rank) fprintf(stderr, "unknown test %s\n", argv[i]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    MPI_Finalize();
    return 0;
}
