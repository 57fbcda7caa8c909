/*
 * The C ABI's test program, compiled against the installed header and
 * library (pkg-config xrcbtl).
 *
 *   xrcbtl_test sim            every check on simulated jobs (XRC, RC, iWARP)
 *   xrcbtl_test verbs DEVICE   two processes on a verbs device (rxe, siw)
 *
 * Exits 0 when every check passed; prints the first failure otherwise.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <xrcbtl.h>

static int checks;

static void fail_rc(int line, const char *what, int rc)
{
    char msg[512];
    xrcbtl_last_error(msg, sizeof msg);
    fprintf(stderr, "FAIL line %d: %s = %d (%s): %s\n", line, what, rc, xrcbtl_strerror(rc), msg);
    exit(1);
}

/* A call that must succeed. */
#define OK(x) do { int rc_ = (x); if (rc_ < 0) fail_rc(__LINE__, #x, rc_); checks++; } while (0)
/* A call that must fail with status s. */
#define FAILS(x, s) do { int rc_ = (x); if (rc_ != (s)) { fprintf(stderr, "FAIL line %d: %s = %d, expected %d (%s)\n", \
    __LINE__, #x, rc_, (s), xrcbtl_strerror(s)); exit(1); } checks++; } while (0)
#define EXPECT(c) do { if (!(c)) { fprintf(stderr, "FAIL line %d: %s\n", __LINE__, #c); exit(1); } checks++; } while (0)

enum { TAG = 7, TAG_ECHO = 8, TAG_HANDLE = 9, MAX_RANKS = 8 };

/* What a rank received. */
struct inbox {
    int count;
    int bad;                       /* messages whose contents were wrong */
    uint32_t next_seq[MAX_RANKS];  /* per source: messages arrive in order */
    uint8_t handle[XRCBTL_REMOTE_MEM_SIZE];
    int have_handle;
    int failed_rank;               /* from the error callback, or -1 */
    int failed_status;
};

static uint8_t pattern(uint32_t seq, size_t i) { return (uint8_t)(seq * 31u + i * 7u + 1u); }

/* Header: sequence and payload length; then the payload's pattern. */
static void on_message(xrcbtl_t *btl, uint32_t src, uint8_t tag, const void *data, size_t len, void *arg)
{
    struct inbox *in = arg;
    const uint8_t *d = data;
    uint32_t seq, plen;
    (void)btl;
    if (tag != TAG || len < 8 || src >= MAX_RANKS) { in->bad++; return; }
    memcpy(&seq, d, 4);
    memcpy(&plen, d + 4, 4);
    if (plen != len - 8 || seq != in->next_seq[src]) { in->bad++; return; }
    for (size_t i = 0; i < plen; i++)
        if (d[8 + i] != pattern(seq, i)) { in->bad++; return; }
    in->next_seq[src]++;
    in->count++;
}

/* Echoes every message back to its sender, from inside the callback. */
static void on_echo(xrcbtl_t *btl, uint32_t src, uint8_t tag, const void *data, size_t len, void *arg)
{
    struct inbox *in = arg;
    (void)tag;
    in->count++;
    if (xrcbtl_send(btl, src, TAG_ECHO, data, len, NULL, 0) != XRCBTL_OK) in->bad++;
}

static void on_handle(xrcbtl_t *btl, uint32_t src, uint8_t tag, const void *data, size_t len, void *arg)
{
    struct inbox *in = arg;
    (void)btl; (void)src; (void)tag;
    if (len != XRCBTL_REMOTE_MEM_SIZE) { in->bad++; return; }
    memcpy(in->handle, data, len);
    in->have_handle = 1;
}

static void on_error(xrcbtl_t *btl, uint32_t rank, int status, const char *reason, void *arg)
{
    struct inbox *in = arg;
    (void)btl;
    if (in->failed_rank < 0) {
        in->failed_rank = (int)rank;
        in->failed_status = status;
        printf("  error callback: rank %u failed: %s (%s)\n", rank, reason, xrcbtl_strerror(status));
    }
}

/* An operation's outcome. */
struct done {
    int finished;
    int status;
    uint64_t value;
};

static void on_done(xrcbtl_t *btl, uint64_t op, int status, uint64_t value, void *arg)
{
    struct done *d = arg;
    (void)btl; (void)op;
    d->finished++;
    d->status = status;
    d->value = value;
}

/* Sends message `seq` of `plen` payload bytes. */
static int send_seq(xrcbtl_t *btl, uint32_t dst, uint32_t seq, uint32_t plen, int inline_only)
{
    uint8_t hdr[8];
    uint8_t *p = malloc(plen ? plen : 1);
    int rc;
    memcpy(hdr, &seq, 4);
    memcpy(hdr + 4, &plen, 4);
    for (size_t i = 0; i < plen; i++) p[i] = pattern(seq, i);
    rc = inline_only ? xrcbtl_sendi(btl, dst, TAG, hdr, 8, p, plen) : xrcbtl_send(btl, dst, TAG, hdr, 8, p, plen);
    free(p);
    return rc;
}

/* ---- simulated jobs ------------------------------------------------------ */

static xrcbtl_sim_t *sim;

/* Steps the job until *flag reaches want (bounded in virtual time). */
static void run_until_at(int line, const int *flag, int want)
{
    uint64_t start = xrcbtl_sim_now_ns(sim);
    while (*flag < want) {
        int rc = xrcbtl_sim_step(sim);
        if (rc < 0) fail_rc(line, "xrcbtl_sim_step", rc);
        if (xrcbtl_sim_now_ns(sim) - start > 5000000000ull) {
            fprintf(stderr, "FAIL line %d: %d of %d after 5 s of virtual time\n", line, *flag, want);
            exit(1);
        }
    }
}
#define run_until(flag, want) run_until_at(__LINE__, flag, want)

static void sim_job(uint32_t device, const char *name)
{
    const char *settings[] = { "XRCBTL_EAGER_LIMIT=4096", "XRCBTL_SEND_SLOTS=16", NULL };
    xrcbtl_sim_params_t sp = {
        .field_mask = XRCBTL_SIM_PARAM_SEED | XRCBTL_SIM_PARAM_NODES | XRCBTL_SIM_PARAM_RANKS_PER_NODE |
                      XRCBTL_SIM_PARAM_DEVICE | XRCBTL_SIM_PARAM_SETTINGS,
        .seed = 42, .nodes = 2, .ranks_per_node = 2, .device = device, .settings = settings,
    };
    struct inbox in[4];
    xrcbtl_t *r[4];
    xrcbtl_info_t info;
    size_t max;

    printf("sim %s: 2 nodes x 2 ranks\n", name);
    OK(xrcbtl_sim_create(&sp, &sim));
    memset(in, 0, sizeof in);
    for (int i = 0; i < 4; i++) {
        r[i] = xrcbtl_sim_rank(sim, (uint32_t)i);
        EXPECT(r[i] != NULL);
        in[i].failed_rank = -1;
        OK(xrcbtl_register_am(r[i], TAG, on_message, &in[i]));
        OK(xrcbtl_set_error_callback(r[i], on_error, &in[i]));
    }
    EXPECT(xrcbtl_sim_rank(sim, 4) == NULL);
    OK(xrcbtl_query(r[0], &info));
    EXPECT(info.rank == 0 && (info.flags & XRCBTL_INFO_SIMULATED));
    EXPECT(info.mode == (device == XRCBTL_SIM_IB ? XRCBTL_MODE_XRC : XRCBTL_MODE_RC));
    /* Rendezvous write on iWARP, read elsewhere (XRCBTL_RNDV_PROTOCOL auto). */
    EXPECT(!!(info.flags & XRCBTL_INFO_PREFERS_PUT) == (device == XRCBTL_SIM_IWARP));
    EXPECT(strcmp(info.device, "sim0") == 0);
    max = xrcbtl_max_send_size(r[0]);
    EXPECT(max == info.max_send_size && max >= 4096);

    /* Addresses travel as bytes; adding a known peer again changes nothing. */
    for (int i = 0; i < 4; i++) {
        uint8_t addr[XRCBTL_ADDRESS_MAX];
        size_t len = sizeof addr, tiny = 3;
        OK(xrcbtl_address(r[i], addr, &len));
        EXPECT(len > 0 && len <= XRCBTL_ADDRESS_MAX);
        FAILS(xrcbtl_address(r[i], addr, &tiny), XRCBTL_ERR_INVALID);
        EXPECT(tiny == len);
        for (int j = 0; j < 4; j++) {
            if (j == i) continue;
            OK(xrcbtl_add_peer(r[j], (uint32_t)i, addr, len));
            FAILS(xrcbtl_add_peer(r[j], (uint32_t)i + 1, addr, len), XRCBTL_ERR_INVALID);
            FAILS(xrcbtl_add_peer(r[j], (uint32_t)i, addr, len - 1), XRCBTL_ERR_INVALID);
        }
    }

    /* Every size from 0 to the largest, to a rank on the other node and to
     * one on the same node, in order. */
    {
        uint32_t sizes[] = { 0, 1, 2, 7, 8, 63, 100, 119, 120, 121, 255, 256, 1000, 4000 };
        int n = 0;
        for (uint32_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            OK(send_seq(r[0], 3, (uint32_t)n, sizes[s], 0));
            OK(send_seq(r[0], 1, (uint32_t)n, sizes[s], 0));
            n++;
        }
        OK(send_seq(r[0], 3, (uint32_t)n, (uint32_t)(max - 8), 0));
        OK(send_seq(r[0], 1, (uint32_t)n, (uint32_t)(max - 8), 0));
        n++;
        FAILS(send_seq(r[0], 3, (uint32_t)n, (uint32_t)(max - 7), 0), XRCBTL_ERR_INVALID);
        /* A NULL buffer with bytes is refused, and says which and how many. */
        {
            char msg[512];
            uint8_t b[8] = { 0 };
            FAILS(xrcbtl_send(r[0], 3, TAG, NULL, 4, b, sizeof b), XRCBTL_ERR_INVALID);
            xrcbtl_last_error(msg, sizeof msg);
            EXPECT(strstr(msg, "header is NULL with 4 bytes") != NULL);
            FAILS(xrcbtl_send(r[0], 3, TAG, b, sizeof b, NULL, 3), XRCBTL_ERR_INVALID);
            xrcbtl_last_error(msg, sizeof msg);
            EXPECT(strstr(msg, "payload is NULL with 3 bytes") != NULL);
        }
        run_until(&in[3].count, n);
        run_until(&in[1].count, n);
        EXPECT(in[3].bad == 0 && in[1].bad == 0);
        /* sendi: at once or not at all. */
        for (int k = 0; k < 50; k++) {
            int rc;
            while ((rc = send_seq(r[0], 3, (uint32_t)n, 64, 1)) == XRCBTL_ERR_AGAIN) {
                if (xrcbtl_sim_step(sim) < 0) fail_rc(__LINE__, "step", -1);
            }
            OK(rc);
            n++;
        }
        run_until(&in[3].count, n);
        EXPECT(in[3].bad == 0);
    }

    /* A callback that sends: rank 2 echoes what it gets. */
    {
        struct inbox echo = { 0 }, back = { 0 };
        OK(xrcbtl_register_am(r[2], TAG_ECHO, on_echo, &echo));
        OK(xrcbtl_register_am(r[1], TAG_ECHO, on_echo, &back));
        OK(xrcbtl_send(r[1], 2, TAG_ECHO, "ping", 4, NULL, 0));
        run_until(&back.count, 1);
        /* Rank 1 echoed back too: a ping-pong that goes on by itself. */
        run_until(&back.count, 20);
        OK(xrcbtl_register_am(r[2], TAG_ECHO, NULL, NULL));
        OK(xrcbtl_register_am(r[1], TAG_ECHO, NULL, NULL));
        EXPECT(echo.bad == 0 && back.bad == 0);
    }

    /* One-sided: rank 3 exposes memory, rank 0 writes, reads and runs
     * atomics on it. */
    {
        enum { LEN = 64 * 1024 };
        uint8_t *theirs = aligned_alloc(64, LEN), *mine = aligned_alloc(64, LEN);
        xrcbtl_mem_t treg, mreg, stale;
        uint8_t packed[XRCBTL_REMOTE_MEM_SIZE];
        struct done d = { 0 };
        uint64_t op = 0;
        uint32_t access = XRCBTL_ACCESS_REMOTE_READ | XRCBTL_ACCESS_REMOTE_WRITE;
        int atomics;

        memset(theirs, 0, LEN);
        for (int i = 0; i < LEN; i++) mine[i] = (uint8_t)(i * 13);
        OK(xrcbtl_query(r[3], &info));
        atomics = (info.flags & XRCBTL_INFO_ATOMICS) != 0;
        if (atomics) access |= XRCBTL_ACCESS_REMOTE_ATOMIC;
        else FAILS(xrcbtl_register_mem(r[3], theirs, LEN, XRCBTL_ACCESS_REMOTE_ATOMIC, &treg), XRCBTL_ERR_UNSUPPORTED);
        FAILS(xrcbtl_register_mem(r[3], theirs, LEN, 1u << 9, &treg), XRCBTL_ERR_INVALID);
        OK(xrcbtl_register_mem(r[3], theirs, LEN, access, &treg));
        OK(xrcbtl_mem_pack(&treg, packed));
        OK(xrcbtl_send(r[3], 0, TAG_HANDLE, packed, sizeof packed, NULL, 0));
        OK(xrcbtl_register_am(r[0], TAG_HANDLE, on_handle, &in[0]));
        run_until(&in[0].have_handle, 1);
        OK(xrcbtl_register_mem(r[0], mine, LEN, 0, &mreg));
        {
            /* A piece of a region the cache holds is served from it. */
            xrcbtl_stats_t before, after;
            xrcbtl_mem_t piece;
            OK(xrcbtl_stats(r[0], &before));
            EXPECT(before.reg_misses >= 1);
            OK(xrcbtl_register_mem(r[0], mine + 64, 1024, 0, &piece));
            OK(xrcbtl_stats(r[0], &after));
            EXPECT(after.reg_hits == before.reg_hits + 1 && after.reg_misses == before.reg_misses);
            OK(xrcbtl_deregister_mem(r[0], &piece));
        }

        OK(xrcbtl_put(r[0], 3, &mreg, mine + 100, in[0].handle, treg.addr + 1000, 30000, on_done, &d, &op));
        run_until(&d.finished, 1);
        if (d.status != XRCBTL_OK) fail_rc(__LINE__, "put", d.status);
        EXPECT(xrcbtl_test(r[0], op) == 1);
        if (device == XRCBTL_SIM_IWARP) {
            /* A write has landed once a later message has arrived. */
            int before = in[3].count;
            OK(send_seq(r[0], 3, in[3].next_seq[0], 0, 0));
            run_until(&in[3].count, before + 1);
        }
        EXPECT(memcmp(theirs + 1000, mine + 100, 30000) == 0);
        for (int i = 0; i < 4096; i++) theirs[50000 + i] = (uint8_t)(i ^ 0x5a);
        memset(mine, 0, 4096);
        OK(xrcbtl_get(r[0], 3, &mreg, mine, in[0].handle, treg.addr + 50000, 4096, on_done, &d, NULL));
        run_until(&d.finished, 2);
        EXPECT(d.status == XRCBTL_OK);
        {
            int wrong = 0;
            for (int i = 0; i < 4096; i++) wrong += mine[i] != (uint8_t)(i ^ 0x5a);
            EXPECT(wrong == 0);
        }
        /* Outside the peer's memory, outside ours: refused at once. */
        FAILS(xrcbtl_put(r[0], 3, &mreg, mine, in[0].handle, treg.addr + LEN - 8, 16, NULL, NULL, NULL), XRCBTL_ERR_INVALID);
        FAILS(xrcbtl_get(r[0], 3, &mreg, mine + LEN - 8, in[0].handle, treg.addr, 16, NULL, NULL, NULL), XRCBTL_ERR_INVALID);

        if (atomics) {
            uint64_t *word = (uint64_t *)(theirs + 256);
            *word = 40;
            OK(xrcbtl_fetch_add(r[0], 3, in[0].handle, treg.addr + 256, 2, on_done, &d, NULL));
            run_until(&d.finished, 3);
            EXPECT(d.status == XRCBTL_OK && d.value == 40 && *word == 42);
            OK(xrcbtl_compare_swap(r[0], 3, in[0].handle, treg.addr + 256, 41, 7, on_done, &d, NULL));
            run_until(&d.finished, 4);
            EXPECT(d.value == 42 && *word == 42); /* no swap */
            OK(xrcbtl_compare_swap(r[0], 3, in[0].handle, treg.addr + 256, 42, 7, on_done, &d, NULL));
            run_until(&d.finished, 5);
            EXPECT(d.value == 42 && *word == 7);
            OK(xrcbtl_atomic_add(r[0], 3, in[0].handle, treg.addr + 256, 5, on_done, &d, NULL));
            run_until(&d.finished, 6);
            EXPECT(d.status == XRCBTL_OK && *word == 12);
            FAILS(xrcbtl_fetch_add(r[0], 3, in[0].handle, treg.addr + 257, 1, NULL, NULL, NULL), XRCBTL_ERR_INVALID);
        } else {
            FAILS(xrcbtl_fetch_add(r[0], 3, in[0].handle, treg.addr + 256, 2, on_done, &d, NULL), XRCBTL_ERR_UNSUPPORTED);
        }

        /* A registration given back is refused; so is a forged one. */
        stale = mreg;
        OK(xrcbtl_deregister_mem(r[0], &mreg));
        FAILS(xrcbtl_put(r[0], 3, &stale, mine, in[0].handle, treg.addr, 8, NULL, NULL, NULL), XRCBTL_ERR_INVALID);
        FAILS(xrcbtl_deregister_mem(r[0], &stale), XRCBTL_ERR_INVALID);
        OK(xrcbtl_deregister_mem(r[3], &treg));
        free(theirs);
        free(mine);
    }

    /* A simulated rank waits in virtual time only. */
    FAILS(xrcbtl_flush(r[0], 1000), XRCBTL_ERR_STATE);
    FAILS(xrcbtl_destroy(r[0]), XRCBTL_ERR_STATE);

    {
        xrcbtl_stats_t st;
        OK(xrcbtl_stats(r[0], &st));
        EXPECT(st.eager_sent >= 30 && st.rdma >= 2 && st.qps_created >= 1);
        OK(xrcbtl_stats(r[3], &st));
        EXPECT(st.eager_received >= 30 && st.unhandled == 0);
    }

    /* A crash: a survivor that talks to the dead rank hears of it. (A
     * send may complete before the loss is known: iWARP completes a send
     * once it has left; the next one then finds the rank gone.) */
    OK(xrcbtl_sim_crash(sim, 1));
    EXPECT(xrcbtl_sim_rank(sim, 1) == NULL);
    for (int k = 0; in[0].failed_rank < 0; k++) {
        int rc = send_seq(r[0], 1, in[1].next_seq[0], 16, 0);
        EXPECT(k < 100);
        if (rc == XRCBTL_ERR_STATE) break; /* the endpoint failed meanwhile */
        OK(rc);
        for (int i = 0; i < 1000 && in[0].failed_rank < 0; i++)
            if (xrcbtl_sim_step(sim) < 0) break;
    }
    EXPECT(in[0].failed_rank == 1);
    EXPECT(in[0].failed_status == XRCBTL_ERR_UNREACHABLE || in[0].failed_status == XRCBTL_ERR_CLOSED);
    FAILS(xrcbtl_sim_crash(sim, 1), XRCBTL_ERR_INVALID);

    /* The others still talk. */
    OK(send_seq(r[0], 3, in[3].next_seq[0], 500, 0));
    run_until(&in[3].count, in[3].count + 1);
    OK(xrcbtl_sim_shutdown(sim, 5000000));
    OK(xrcbtl_sim_destroy(sim));
}

static void argument_checks(void)
{
    char msg[512];
    const char *bad[] = { "XRCBTL_NO_SUCH_SETTING=1", NULL };
    const char *bad_value[] = { "XRCBTL_EAGER_LIMIT=lots", NULL };
    xrcbtl_sim_params_t sp = { .field_mask = XRCBTL_SIM_PARAM_SETTINGS, .settings = bad };
    xrcbtl_sim_t *s = NULL;
    const xrcbtl_setting_t *table;
    size_t n;
    int found = 0;

    printf("arguments\n");
    EXPECT(xrcbtl_abi_version() == XRCBTL_ABI_VERSION);
    FAILS(xrcbtl_sim_create(&sp, &s), XRCBTL_ERR_INVALID);
    xrcbtl_last_error(msg, sizeof msg);
    EXPECT(strstr(msg, "XRCBTL_NO_SUCH_SETTING") != NULL);
    sp.settings = bad_value;
    FAILS(xrcbtl_sim_create(&sp, &s), XRCBTL_ERR_INVALID);
    FAILS(xrcbtl_sim_create(NULL, &s), XRCBTL_ERR_INVALID);
    FAILS(xrcbtl_progress(NULL), XRCBTL_ERR_INVALID);
    FAILS(xrcbtl_set_peer_resolver(NULL, NULL, NULL), XRCBTL_ERR_INVALID);
    FAILS(xrcbtl_send(NULL, 0, 0, NULL, 0, NULL, 0), XRCBTL_ERR_INVALID);
    EXPECT(xrcbtl_max_send_size(NULL) == 0);
    EXPECT(strcmp(xrcbtl_strerror(XRCBTL_ERR_AGAIN), xrcbtl_strerror(XRCBTL_OK)) != 0);

    n = xrcbtl_settings(&table);
    EXPECT(n >= 10);
    for (size_t i = 0; i < n; i++) {
        EXPECT(strncmp(table[i].name, "XRCBTL_", 7) == 0 && table[i].default_value && table[i].help);
        found |= strcmp(table[i].name, "XRCBTL_EAGER_LIMIT") == 0;
    }
    EXPECT(found);
}

/* ---- two processes on a verbs device --------------------------------------- */

static uint64_t now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000u + (uint64_t)t.tv_nsec / 1000u;
}

static void progress_until(xrcbtl_t *btl, const int *flag, int want)
{
    uint64_t end = now_us() + 30u * 1000000u;
    while (*flag < want) {
        int rc = xrcbtl_progress(btl);
        if (rc < 0) fail_rc(__LINE__, "xrcbtl_progress", rc);
        if (now_us() > end) {
            fprintf(stderr, "FAIL: %d of %d after 30 s\n", *flag, want);
            exit(1);
        }
    }
}

static void write_all(int fd, const void *p, size_t n)
{
    if (write(fd, p, n) != (ssize_t)n) { perror("write"); exit(1); }
}

static void read_all(int fd, void *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, (char *)p + got, n - got);
        if (k <= 0) { perror("read"); exit(1); }
        got += (size_t)k;
    }
}

/* One rank of the two-process test; `fd` reaches the other process. */
static int verbs_rank(uint32_t rank, const char *device, const char *job, int fd)
{
    xrcbtl_params_t p = {
        .field_mask = XRCBTL_PARAM_RANK | XRCBTL_PARAM_JOB | XRCBTL_PARAM_DEVICE,
        .rank = rank, .job = job, .device = device,
    };
    xrcbtl_t *btl;
    uint8_t mine[XRCBTL_ADDRESS_MAX], theirs[XRCBTL_ADDRESS_MAX];
    size_t mlen = sizeof mine, tlen;
    struct inbox in = { 0 }, echo = { 0 };
    uint32_t peer = 1 - rank;
    xrcbtl_info_t info;
    enum { LEN = 1 << 20 };
    uint8_t *mem = aligned_alloc(4096, LEN);
    xrcbtl_mem_t reg;
    uint8_t packed[XRCBTL_REMOTE_MEM_SIZE];
    struct done d = { 0 };
    int atomics;

    in.failed_rank = -1;
    OK(xrcbtl_create(&p, &btl));
    OK(xrcbtl_query(btl, &info));
    printf("rank %u on %s: mode %s, atomics %s, max send %" PRIu64 "\n", rank, info.device,
           info.mode == XRCBTL_MODE_XRC ? "XRC" : "RC", (info.flags & XRCBTL_INFO_ATOMICS) ? "yes" : "no",
           info.max_send_size);
    atomics = (info.flags & XRCBTL_INFO_ATOMICS) != 0;
    OK(xrcbtl_register_am(btl, TAG, on_message, &in));
    OK(xrcbtl_register_am(btl, TAG_ECHO, on_echo, &echo));
    OK(xrcbtl_register_am(btl, TAG_HANDLE, on_handle, &in));
    OK(xrcbtl_set_error_callback(btl, on_error, &in));

    /* The address exchange an MPI library does through its runtime. */
    OK(xrcbtl_address(btl, mine, &mlen));
    write_all(fd, &mlen, sizeof mlen);
    write_all(fd, mine, mlen);
    read_all(fd, &tlen, sizeof tlen);
    EXPECT(tlen <= sizeof theirs);
    read_all(fd, theirs, tlen);
    OK(xrcbtl_add_peer(btl, peer, theirs, tlen));

    /* Rank 0 sends every size in order; rank 1 counts them. */
    {
        uint32_t n = 0;
        if (rank == 0) {
            for (uint32_t s = 0; s + 8 <= info.max_send_size; s = s ? s * 2 : 1) {
                OK(send_seq(btl, peer, n++, s, 0));
            }
            OK(send_seq(btl, peer, n++, (uint32_t)info.max_send_size - 8, 0));
            write_all(fd, &n, sizeof n);
        } else {
            read_all(fd, &n, sizeof n);
            progress_until(btl, &in.count, (int)n);
            EXPECT(in.bad == 0);
        }
    }

    /* Ping-pong through callbacks that answer from inside. */
    if (rank == 0) {
        uint64_t t0 = now_us();
        OK(xrcbtl_send(btl, peer, TAG_ECHO, "x", 1, NULL, 0));
        progress_until(btl, &echo.count, 1000);
        printf("  1000 round trips through callbacks: %.1f us each\n", (double)(now_us() - t0) / 1000.0);
        OK(xrcbtl_register_am(btl, TAG_ECHO, NULL, NULL));
    } else {
        progress_until(btl, &echo.count, 1000);
    }

    /* Rank 1 exposes 1 MiB; rank 0 puts, gets and runs atomics on it. */
    memset(mem, 0, LEN);
    OK(xrcbtl_register_mem(btl, mem, LEN,
                           XRCBTL_ACCESS_REMOTE_READ | XRCBTL_ACCESS_REMOTE_WRITE |
                           (atomics ? XRCBTL_ACCESS_REMOTE_ATOMIC : 0), &reg));
    if (rank == 1) {
        int go = 0;
        OK(xrcbtl_mem_pack(&reg, packed));
        OK(xrcbtl_send(btl, peer, TAG_HANDLE, packed, sizeof packed, NULL, 0));
        /* Rank 0 says (over the socket) when it is done with the memory. */
        while (!go) {
            OK(xrcbtl_progress(btl));
            if (recv(fd, &go, sizeof go, MSG_DONTWAIT) < 0 && errno != EAGAIN) { perror("recv"); exit(1); }
        }
        {
            int wrong = 0;
            for (int i = 0; i < LEN; i++)
                if (!(atomics && i >= 8 && i < 16)) wrong += mem[i] != (uint8_t)(i * 7);
            EXPECT(wrong == 0);
        }
        if (atomics) EXPECT(*(uint64_t *)(mem + 8) == 1000 + 3);
    } else {
        uint64_t remote_base, t0;
        int go = 1;
        progress_until(btl, &in.have_handle, 1);
        memcpy(&remote_base, in.handle, 8);
        for (int i = 0; i < LEN; i++) mem[i] = (uint8_t)(i * 7);
        t0 = now_us();
        OK(xrcbtl_put(btl, peer, &reg, mem, in.handle, remote_base, LEN, on_done, &d, NULL));
        progress_until(btl, &d.finished, 1);
        EXPECT(d.status == XRCBTL_OK);
        printf("  put of 1 MiB: %.1f us\n", (double)(now_us() - t0));
        memset(mem, 0, LEN);
        OK(xrcbtl_get(btl, peer, &reg, mem, in.handle, remote_base, LEN, on_done, &d, NULL));
        progress_until(btl, &d.finished, 2);
        EXPECT(d.status == XRCBTL_OK);
        {
            int wrong = 0;
            for (int i = 0; i < LEN; i++) wrong += mem[i] != (uint8_t)(i * 7);
            EXPECT(wrong == 0);
        }
        if (atomics) {
            /* The word at offset 8 of the peer's memory holds what the put
             * wrote there: swap it for 1000, then add 3. */
            OK(xrcbtl_compare_swap(btl, peer, in.handle, remote_base + 8, *(uint64_t *)(mem + 8), 1000,
                                   on_done, &d, NULL));
            progress_until(btl, &d.finished, 3);
            EXPECT(d.status == XRCBTL_OK && d.value == *(uint64_t *)(mem + 8));
            OK(xrcbtl_fetch_add(btl, peer, in.handle, remote_base + 8, 3, on_done, &d, NULL));
            progress_until(btl, &d.finished, 4);
            EXPECT(d.status == XRCBTL_OK && d.value == 1000);
        } else {
            FAILS(xrcbtl_fetch_add(btl, peer, in.handle, remote_base + 8, 3, NULL, NULL, NULL), XRCBTL_ERR_UNSUPPORTED);
        }
        OK(xrcbtl_flush(btl, 10u * 1000000u));
        write_all(fd, &go, sizeof go);
    }
    OK(xrcbtl_deregister_mem(btl, &reg));

    /* Both leave cleanly. */
    OK(xrcbtl_flush(btl, 10u * 1000000u));
    {
        int bye = 1;
        write_all(fd, &bye, sizeof bye);
        read_all(fd, &bye, sizeof bye);
    }
    OK(xrcbtl_shutdown(btl, 10u * 1000000u));
    EXPECT(in.failed_rank < 0);
    OK(xrcbtl_destroy(btl));
    FAILS(xrcbtl_progress(btl), XRCBTL_ERR_INVALID);
    free(mem);
    printf("rank %u: %d checks passed\n", rank, checks);
    return 0;
}

static int verbs_test(const char *device)
{
    int sv[2], status = 0;
    char job[64];
    pid_t child;

    snprintf(job, sizeof job, "ctest-%d", (int)getpid());
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) { perror("socketpair"); return 1; }
    fflush(stdout);
    child = fork();
    if (child < 0) { perror("fork"); return 1; }
    if (child == 0) {
        close(sv[0]);
        _exit(verbs_rank(1, device, job, sv[1]));
    }
    close(sv[1]);
    verbs_rank(0, device, job, sv[0]);
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "FAIL: rank 1 exited with status %d\n", status);
        return 1;
    }
    printf("verbs %s: passed\n", device);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "sim") == 0) {
        argument_checks();
        sim_job(XRCBTL_SIM_IB, "InfiniBand (XRC)");
        sim_job(XRCBTL_SIM_ROCE, "RoCE (RC + SRQ)");
        sim_job(XRCBTL_SIM_IWARP, "iWARP (RC, credits)");
        printf("xrcbtl_test sim: %d checks passed\n", checks);
        return 0;
    }
    if (argc >= 3 && strcmp(argv[1], "verbs") == 0) return verbs_test(argv[2]);
    fprintf(stderr, "usage: %s sim | verbs DEVICE\n", argv[0]);
    return 2;
}
