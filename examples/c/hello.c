/*
 * A C program on libxrcbtl: four ranks of a simulated job (two nodes, two
 * ranks each, XRC) in this process. Every rank greets every other with an
 * active message; then each puts its name into rank 0's registered memory
 * and adds one to a counter there with an atomic. Prints "PASS hello" when
 * everything arrived as sent.
 *
 *   cc hello.c $(pkg-config --cflags --libs xrcbtl) -o hello && ./hello
 *
 * A program on real devices makes one rank per process with xrcbtl_create
 * instead, publishes xrcbtl_address() to its peers (its own out-of-band
 * channel: PMIx, a file, a socket), adds them with xrcbtl_add_peer and
 * calls xrcbtl_progress from its own loop.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xrcbtl.h>

#define RANKS 4
#define GREETING 7 /* the active-message tag */

static int greetings[RANKS];
static int ops_done;

/* Must succeed, or the program stops with the library's reason. */
static void ok(int rc, const char *what)
{
    if (XRCBTL_OK != rc) {
        char msg[256];
        xrcbtl_last_error(msg, sizeof msg);
        fprintf(stderr, "hello: %s: %s (%s)\n", what, xrcbtl_strerror(rc), msg);
        exit(1);
    }
}

static void on_greeting(xrcbtl_t *btl, uint32_t src, uint8_t tag, const void *data, size_t len, void *arg)
{
    uint32_t me = *(const uint32_t *) arg;
    char want[32];
    (void) btl;
    (void) tag;
    snprintf(want, sizeof want, "hello %u from %u", me, src);
    if (len != strlen(want) || memcmp(data, want, len) != 0) {
        fprintf(stderr, "hello: rank %u got a wrong greeting from %u\n", me, src);
        exit(1);
    }
    greetings[me]++;
}

static void on_done(xrcbtl_t *btl, uint64_t op, int status, uint64_t value, void *arg)
{
    (void) btl;
    (void) op;
    (void) value;
    (void) arg;
    ok(status, "a put or an atomic");
    ops_done++;
}

/* Runs every rank's progress once, or moves virtual time on. */
static void step(xrcbtl_sim_t *sim)
{
    int n = xrcbtl_sim_step(sim);
    if (n < 0) ok(n, "xrcbtl_sim_step");
}

int main(void)
{
    xrcbtl_sim_params_t params = {
        .field_mask = XRCBTL_SIM_PARAM_NODES | XRCBTL_SIM_PARAM_RANKS_PER_NODE,
        .nodes = 2,
        .ranks_per_node = 2,
    };
    xrcbtl_sim_t *sim;
    xrcbtl_t *r[RANKS];
    uint32_t ids[RANKS];
    int total = 0;

    if (xrcbtl_abi_version() != XRCBTL_ABI_VERSION) {
        fprintf(stderr, "hello: built for ABI %d, the library is %u\n", XRCBTL_ABI_VERSION, xrcbtl_abi_version());
        return 1;
    }
    ok(xrcbtl_sim_create(&params, &sim), "xrcbtl_sim_create");
    for (uint32_t i = 0; i < RANKS; i++) {
        ids[i] = i;
        r[i] = xrcbtl_sim_rank(sim, i);
        ok(xrcbtl_register_am(r[i], GREETING, on_greeting, &ids[i]), "xrcbtl_register_am");
    }

    /* Active messages: connections are made on first use. */
    for (uint32_t i = 0; i < RANKS; i++)
        for (uint32_t j = 0; j < RANKS; j++) {
            char text[32];
            if (i == j) continue;
            snprintf(text, sizeof text, "hello %u from %u", j, i);
            ok(xrcbtl_send(r[i], j, GREETING, NULL, 0, text, strlen(text)), "xrcbtl_send");
        }
    for (int k = 0; k < RANKS; k++) {
        while (greetings[k] < RANKS - 1) step(sim);
        total += greetings[k];
    }

    /* One-sided: rank 0 exposes 64 bytes; the others put their names
     * there and add to the counter in its first word. */
    {
        uint64_t *window = calloc(8, sizeof(uint64_t));
        char names[RANKS][8];
        xrcbtl_mem_t exposed, mine[RANKS];
        uint8_t handle[XRCBTL_REMOTE_MEM_SIZE];
        ok(xrcbtl_register_mem(r[0], window, 64,
                               XRCBTL_ACCESS_REMOTE_WRITE | XRCBTL_ACCESS_REMOTE_ATOMIC, &exposed),
           "xrcbtl_register_mem");
        ok(xrcbtl_mem_pack(&exposed, handle), "xrcbtl_mem_pack");
        for (uint32_t i = 1; i < RANKS; i++) {
            snprintf(names[i], sizeof names[i], "rank %u", i);
            ok(xrcbtl_register_mem(r[i], names[i], sizeof names[i], 0, &mine[i]), "xrcbtl_register_mem");
            ok(xrcbtl_put(r[i], 0, &mine[i], names[i], handle, (uint64_t) (uintptr_t) &window[i], 8, on_done,
                          NULL, NULL),
               "xrcbtl_put");
            ok(xrcbtl_fetch_add(r[i], 0, handle, (uint64_t) (uintptr_t) &window[0], 1, on_done, NULL, NULL),
               "xrcbtl_fetch_add");
        }
        while (ops_done < 2 * (RANKS - 1)) step(sim);
        for (uint32_t i = 1; i < RANKS; i++) {
            if (memcmp(&window[i], names[i], 8) != 0) {
                fprintf(stderr, "hello: rank %u's put did not land\n", i);
                return 1;
            }
            ok(xrcbtl_deregister_mem(r[i], &mine[i]), "xrcbtl_deregister_mem");
        }
        if (window[0] != RANKS - 1) {
            fprintf(stderr, "hello: the counter holds %" PRIu64 ", not %d\n", window[0], RANKS - 1);
            return 1;
        }
        ok(xrcbtl_deregister_mem(r[0], &exposed), "xrcbtl_deregister_mem");
        free(window);
    }

    printf("hello: %d greetings, 3 puts and 3 atomics at %.1f us of virtual time\n", total,
           (double) xrcbtl_sim_now_ns(sim) / 1000.0);
    ok(xrcbtl_sim_shutdown(sim, 1000000), "xrcbtl_sim_shutdown");
    ok(xrcbtl_sim_destroy(sim), "xrcbtl_sim_destroy");
    printf("PASS hello\n");
    return 0;
}
