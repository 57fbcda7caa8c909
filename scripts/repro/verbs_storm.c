/*
 * verbs_storm: the one-sided load of MPI's osc/rdma, with nothing but
 * libibverbs. No MPI, no xrcbtl: a small program to tell a kernel or
 * emulator fault from a transport library's.
 *
 *   verbs_storm DEVICE SECONDS [THREADS]
 *
 * Each thread owns a completion queue and two RC queue pairs on DEVICE's
 * port 1, connected to each other through the device's loopback (on rxe:
 * through the kernel's network stack, so both the requester and the
 * responder run per packet). Until SECONDS have passed, each thread
 * repeats an epoch:
 *   - registers a fresh 1 MiB window (remote read, write and atomics) and
 *     fresh local buffers, as a registration cache does when memory is new;
 *   - posts batches of 16 signalled work requests on one queue pair: RDMA
 *     writes of 8 B to 64 KiB (inline when small), RDMA reads back, and
 *     8-byte fetch-and-adds and compare-and-swaps on counters in the
 *     window, each atomic with its own result slot;
 *   - polls every completion, then checks every read and every atomic's
 *     result against what this thread wrote;
 *   - deregisters what it registered.
 * Exits 0 if every completion succeeded and every check held, 1 otherwise,
 * 2 on bad arguments or a missing device. The last line counts the epochs
 * and the operations.
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WINDOW (1u << 20)
#define LOCAL (1u << 20)
#define BATCH 16
#define MAX_IO (64u << 10)
#define COUNTERS 64 /* 8-byte counters at the window's start */

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static int gid_index = -1;
static double deadline;
static int atomics;
static uint32_t max_inline;

struct tally {
    unsigned long epochs, writes, reads, atomics;
    int failed;
};

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static uint32_t next(uint64_t *s) /* xorshift64* */
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (uint32_t)((*s * 0x2545F4914F6CDD1DULL) >> 32);
}

static struct ibv_qp *make_qp(struct ibv_cq *cq)
{
    struct ibv_qp_init_attr a = {
        .send_cq = cq,
        .recv_cq = cq,
        .cap = { .max_send_wr = BATCH, .max_recv_wr = 1, .max_send_sge = 1,
                 .max_recv_sge = 1, .max_inline_data = max_inline },
        .qp_type = IBV_QPT_RC,
    };
    struct ibv_qp *qp = ibv_create_qp(pd, &a);
    if (!qp) {
        perror("ibv_create_qp");
        return NULL;
    }
    struct ibv_qp_attr m = {
        .qp_state = IBV_QPS_INIT,
        .port_num = 1,
        .qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE |
                           (atomics ? IBV_ACCESS_REMOTE_ATOMIC : 0),
    };
    if (ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                  IBV_QP_ACCESS_FLAGS)) {
        perror("ibv_modify_qp INIT");
        return NULL;
    }
    return qp;
}

static int connect_qp(struct ibv_qp *qp, uint32_t remote_qpn)
{
    struct ibv_qp_attr m = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = IBV_MTU_1024,
        .dest_qp_num = remote_qpn,
        .rq_psn = 1,
        .max_dest_rd_atomic = BATCH,
        .min_rnr_timer = 12,
        .ah_attr = { .is_global = 1, .port_num = 1,
                     .grh = { .dgid = gid, .sgid_index = (uint8_t)gid_index,
                              .hop_limit = 64 } },
    };
    if (ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
        perror("ibv_modify_qp RTR");
        return -1;
    }
    m.qp_state = IBV_QPS_RTS;
    m.timeout = 14;
    m.retry_cnt = 7;
    m.rnr_retry = 7;
    m.sq_psn = 1;
    m.max_rd_atomic = BATCH;
    if (ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                  IBV_QP_MAX_QP_RD_ATOMIC)) {
        perror("ibv_modify_qp RTS");
        return -1;
    }
    return 0;
}

static int fail(struct tally *t, const char *what, unsigned long a, unsigned long b)
{
    fprintf(stderr, "verbs_storm: %s (%lu, %lu)\n", what, a, b);
    t->failed = 1;
    return -1;
}

/* Buffers of one thread: the window, its shadow (what the window must hold),
 * the writes' sources, the reads' destinations, what each read must find,
 * and the atomics' result slots. */
struct bufs {
    char *window, *shadow, *src, *dst, *want;
    uint64_t *results;
};

/* One epoch: fresh registrations, 8 batches with their checks,
 * deregistration. */
static int epoch(struct ibv_cq *cq, struct ibv_qp *qp, struct bufs *m,
                 uint64_t *rng, struct tally *t)
{
    char *window = m->window, *src = m->src, *dst = m->dst;
    uint64_t *results = m->results;
    int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
              IBV_ACCESS_REMOTE_WRITE | (atomics ? IBV_ACCESS_REMOTE_ATOMIC : 0);
    struct ibv_mr *wmr = ibv_reg_mr(pd, window, WINDOW, acc);
    struct ibv_mr *smr = ibv_reg_mr(pd, src, LOCAL, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *dmr = ibv_reg_mr(pd, dst, LOCAL, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *rmr = ibv_reg_mr(pd, results, BATCH * 8, IBV_ACCESS_LOCAL_WRITE);
    if (!wmr || !smr || !dmr || !rmr)
        return fail(t, "ibv_reg_mr failed", !!wmr, !!smr);
    memset(window, 0, COUNTERS * 8);
    memcpy(m->shadow, window, WINDOW);
    uint64_t expect[COUNTERS] = { 0 };
    for (int batch = 0; batch < 8; batch++) {
        struct ibv_send_wr wr[BATCH];
        struct ibv_sge sge[BATCH];
        /* Per request: its kind, where in the window (or which counter),
         * its length, its local offset, an atomic's expected result. */
        struct { int kind; uint32_t off, len, local; uint64_t want; } what[BATCH];
        memset(wr, 0, sizeof wr);
        uint32_t wbase = COUNTERS * 8 + (next(rng) % 8) * (64u << 10);
        for (int i = 0; i < BATCH; i++) {
            uint32_t r = next(rng);
            int kind = atomics ? (int)(r % 4) : (int)(r % 2);
            uint32_t len = 8u << (r >> 8) % 14; /* 8 B .. 64 KiB */
            if (len > MAX_IO)
                len = MAX_IO;
            uint32_t off = (uint32_t)i * MAX_IO % LOCAL;
            wr[i].wr_id = (uint64_t)i;
            wr[i].sg_list = &sge[i];
            wr[i].num_sge = 1;
            wr[i].send_flags = IBV_SEND_SIGNALED;
            what[i].kind = kind;
            what[i].local = off;
            if (kind == 0) { /* write a pattern into the window */
                uint32_t at = wbase + (i % 4) * (MAX_IO / 4);
                len = len > MAX_IO / 4 ? MAX_IO / 4 : len;
                for (uint32_t k = 0; k < len; k++)
                    src[off + k] = (char)(r + k * 7);
                memcpy(m->shadow + at, src + off, len);
                sge[i] = (struct ibv_sge){ (uintptr_t)(src + off), len, smr->lkey };
                wr[i].opcode = IBV_WR_RDMA_WRITE;
                wr[i].wr.rdma.remote_addr = (uintptr_t)(window + at);
                wr[i].wr.rdma.rkey = wmr->rkey;
                if (len <= max_inline)
                    wr[i].send_flags |= IBV_SEND_INLINE;
                what[i].off = at;
                what[i].len = len;
                t->writes++;
            } else if (kind == 1) { /* read a span of the window back */
                uint32_t at = wbase;
                sge[i] = (struct ibv_sge){ (uintptr_t)(dst + off), len, dmr->lkey };
                memcpy(m->want + off, m->shadow + at, len);
                memset(dst + off, 0xEE, len);
                wr[i].opcode = IBV_WR_RDMA_READ;
                wr[i].wr.rdma.remote_addr = (uintptr_t)(window + at);
                wr[i].wr.rdma.rkey = wmr->rkey;
                what[i].off = at;
                what[i].len = len;
                t->reads++;
            } else { /* fetch-and-add or compare-and-swap on a counter */
                uint32_t c = r % COUNTERS;
                sge[i] = (struct ibv_sge){ (uintptr_t)&results[i], 8, rmr->lkey };
                wr[i].wr.atomic.remote_addr = (uintptr_t)(window + c * 8);
                wr[i].wr.atomic.rkey = wmr->rkey;
                what[i].off = c;
                what[i].want = expect[c];
                if (kind == 2) {
                    wr[i].opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
                    wr[i].wr.atomic.compare_add = 3;
                    expect[c] += 3;
                } else {
                    wr[i].opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
                    wr[i].wr.atomic.compare_add = expect[c];
                    wr[i].wr.atomic.swap = expect[c] + 5;
                    expect[c] += 5;
                }
                t->atomics++;
            }
            wr[i].next = i + 1 < BATCH ? &wr[i + 1] : NULL;
        }
        struct ibv_send_wr *bad;
        if (ibv_post_send(qp, wr, &bad))
            return fail(t, "ibv_post_send failed at", (unsigned long)(bad - wr), 0);
        int done = 0;
        while (done < BATCH) {
            struct ibv_wc wc[BATCH];
            int n = ibv_poll_cq(cq, BATCH, wc);
            if (n < 0)
                return fail(t, "ibv_poll_cq failed", (unsigned long)n, 0);
            for (int k = 0; k < n; k++) {
                if (wc[k].status != IBV_WC_SUCCESS)
                    return fail(t, ibv_wc_status_str(wc[k].status), wc[k].wr_id,
                                wc[k].vendor_err);
                if ((int)wc[k].wr_id != done)
                    return fail(t, "completion out of order", wc[k].wr_id, done);
                done++;
            }
        }
        /* The responder ran every request in order: a read saw the writes
         * posted before it, each atomic the value the ones before it left. */
        for (int i = 0; i < BATCH; i++) {
            uint32_t off = what[i].local;
            if (what[i].kind == 1 && memcmp(dst + off, m->want + off, what[i].len))
                return fail(t, "a read did not return what was written", what[i].off,
                            what[i].len);
            if (what[i].kind >= 2 && results[i] != what[i].want)
                return fail(t, "an atomic returned the wrong value", results[i],
                            what[i].want);
        }
        for (int c = 0; c < COUNTERS; c++) {
            uint64_t v;
            memcpy(&v, window + c * 8, 8);
            if (v != expect[c])
                return fail(t, "a counter holds the wrong value", v, expect[c]);
        }
        if (memcmp(window + COUNTERS * 8, m->shadow + COUNTERS * 8, WINDOW - COUNTERS * 8))
            return fail(t, "the window does not hold what was written", 0, 0);
    }
    if (ibv_dereg_mr(rmr) || ibv_dereg_mr(dmr) || ibv_dereg_mr(smr) || ibv_dereg_mr(wmr))
        return fail(t, "ibv_dereg_mr failed", 0, 0);
    t->epochs++;
    return 0;
}

static void *run(void *arg)
{
    struct tally *t = arg;
    uint64_t rng = 0x9E3779B97F4A7C15ULL ^ (uintptr_t)arg ^ (uint64_t)now();
    struct ibv_cq *cq = ibv_create_cq(ctx, 4 * BATCH, NULL, NULL, 0);
    struct ibv_qp *a = cq ? make_qp(cq) : NULL;
    struct ibv_qp *b = cq ? make_qp(cq) : NULL;
    if (!a || !b || connect_qp(a, b->qp_num) || connect_qp(b, a->qp_num)) {
        fail(t, "could not set up a queue pair pair", !!a, !!b);
        return NULL;
    }
    struct bufs m = {
        aligned_alloc(4096, WINDOW), malloc(WINDOW), aligned_alloc(4096, LOCAL),
        aligned_alloc(4096, LOCAL), malloc(LOCAL), aligned_alloc(4096, 4096),
    };
    while (!t->failed && now() < deadline) {
        if (epoch(cq, a, &m, &rng, t))
            break;
        /* New pages at new addresses, as an application's allocator gives. */
        free(m.window);
        m.window = aligned_alloc(4096, WINDOW);
    }
    ibv_destroy_qp(a);
    ibv_destroy_qp(b);
    ibv_destroy_cq(cq);
    free(m.window);
    free(m.shadow);
    free(m.src);
    free(m.dst);
    free(m.want);
    free(m.results);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 3 || atoi(argv[2]) <= 0) {
        fprintf(stderr, "usage: verbs_storm DEVICE SECONDS [THREADS]\n");
        return 2;
    }
    int threads = argc > 3 ? atoi(argv[3]) : 2;
    if (threads < 1 || threads > 64) {
        fprintf(stderr, "verbs_storm: THREADS is 1 to 64\n");
        return 2;
    }
    int n;
    struct ibv_device **list = ibv_get_device_list(&n);
    for (int i = 0; list && i < n && !ctx; i++)
        if (!strcmp(ibv_get_device_name(list[i]), argv[1]))
            ctx = ibv_open_device(list[i]);
    if (!ctx) {
        fprintf(stderr, "verbs_storm: no device %s\n", argv[1]);
        return 2;
    }
    struct ibv_device_attr da;
    struct ibv_port_attr pa;
    if (ibv_query_device(ctx, &da) || ibv_query_port(ctx, 1, &pa)) {
        perror("ibv_query");
        return 2;
    }
    atomics = da.atomic_cap != IBV_ATOMIC_NONE;
    for (int i = 0; i < pa.gid_tbl_len && gid_index < 0; i++) {
        union ibv_gid g;
        if (ibv_query_gid(ctx, 1, i, &g) == 0 && (g.global.subnet_prefix || g.global.interface_id)) {
            gid = g;
            gid_index = i;
        }
    }
    if (gid_index < 0) {
        fprintf(stderr, "verbs_storm: %s port 1 has no GID\n", argv[1]);
        return 2;
    }
    pd = ibv_alloc_pd(ctx);
    if (!pd) {
        perror("ibv_alloc_pd");
        return 2;
    }
    /* The inline size the device takes, from 256 down (rxe and siw differ). */
    for (max_inline = 256; max_inline; max_inline /= 2) {
        struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
        struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq,
            .cap = { 1, 1, 1, 1, max_inline }, .qp_type = IBV_QPT_RC };
        struct ibv_qp *qp = cq ? ibv_create_qp(pd, &a) : NULL;
        if (qp)
            ibv_destroy_qp(qp);
        if (cq)
            ibv_destroy_cq(cq);
        if (qp)
            break;
    }
    printf("verbs_storm: %s, %d threads for %s s, atomics %s, inline %u B, gid index %d\n",
           argv[1], threads, argv[2], atomics ? "yes" : "no", max_inline, gid_index);
    fflush(stdout);
    deadline = now() + atoi(argv[2]);
    pthread_t th[64];
    struct tally t[64];
    memset(t, 0, sizeof t);
    for (int i = 0; i < threads; i++)
        pthread_create(&th[i], NULL, run, &t[i]);
    struct tally sum = { 0 };
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        sum.epochs += t[i].epochs;
        sum.writes += t[i].writes;
        sum.reads += t[i].reads;
        sum.atomics += t[i].atomics;
        sum.failed |= t[i].failed;
    }
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    printf("verbs_storm: %s: %lu epochs, %lu writes, %lu reads, %lu atomics\n",
           sum.failed ? "FAILED" : "ok", sum.epochs, sum.writes, sum.reads, sum.atomics);
    return sum.failed;
}
