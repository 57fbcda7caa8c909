/*
 * A peer that dies mid-transfer, through libfabric's API alone
 * (scripts/guest-ofi kills it). Three processes on one verbs device, or
 * on two nodes: a survivor, a victim and a bystander. Each writes its
 * endpoint's name into DIR/ROLE.addr and inserts the others' names once
 * their files are there.
 *
 *   survivor: keeps WINDOW tagged sends of BIG bytes in flight to the
 *             victim (each read by the victim's receive: a rendezvous
 *             that is pending until then), and prints "flowing" once
 *             FLOWING of them have completed. The script kills the victim
 *             then. Every send still pending must complete in error
 *             (fi_cq_readerr, with fi_cq_strerror's reason), and no new
 *             send to the victim may hang; then one message each way with
 *             the bystander must still go through. Prints what it saw and
 *             exits 0, or 1 with the reason.
 *   victim:   receives and reads its queue until killed.
 *   bystander: answers one message from the survivor, then exits.
 *
 *   kill ROLE DIR
 *
 * The waits follow events (files appearing, completions); each is bounded
 * by LIMIT_S, the harness's limit, which only a hung run reaches.
 */
#define _POSIX_C_SOURCE 200809L
#include <rdma/fi_tagged.h>

#include <stdlib.h>

#include "procs.h"

enum { WINDOW = 4, FLOWING = 16, BIG = 1 << 20 };

/* One completion: 1, or 0 after an error completion (in *e), or -1 on a
 * timeout. */
static int one(struct fi_cq_tagged_entry *c, struct fi_cq_err_entry *e, double limit)
{
    for (double end = now_s() + limit; now_s() < end;) {
        ssize_t n = fi_cq_read(cq, c, 1);
        if (n == 1)
            return 1;
        if (n == -FI_EAVAIL) {
            memset(e, 0, sizeof *e);
            if (fi_cq_readerr(cq, e, 0) != 1)
                DIE("kill: fi_cq_readerr");
            return 0;
        }
        if (n != -FI_EAGAIN)
            DIE("kill: fi_cq_read: %s", fi_strerror((int) -n));
    }
    return -1;
}

static void victim(const char *dir)
{
    static uint8_t buf[WINDOW][BIG];
    static int ctx[WINDOW];
    publish(dir, "victim");
    (void) peer(dir, "survivor");
    for (int i = 0; i < WINDOW; i++)
        if (fi_trecv(ep, buf[i], BIG, NULL, FI_ADDR_UNSPEC, 1, 0, &ctx[i]))
            DIE("kill: victim: fi_trecv");
    for (;;) {
        struct fi_cq_tagged_entry c;
        struct fi_cq_err_entry e;
        if (one(&c, &e, LIMIT_S) != 1)
            DIE("kill: victim: no message within %d s", LIMIT_S);
        int i = (int) ((int *) c.op_context - ctx);
        if (fi_trecv(ep, buf[i], BIG, NULL, FI_ADDR_UNSPEC, 1, 0, &ctx[i]))
            DIE("kill: victim: fi_trecv");
    }
}

static void bystander(const char *dir)
{
    uint8_t in[8] = {0}, out[8] = {7, 7, 7, 7, 7, 7, 7, 7};
    int rctx, sctx;
    struct fi_cq_tagged_entry c;
    struct fi_cq_err_entry e;
    publish(dir, "bystander");
    fi_addr_t s = peer(dir, "survivor");
    if (fi_trecv(ep, in, sizeof in, NULL, FI_ADDR_UNSPEC, 2, 0, &rctx))
        DIE("kill: bystander: fi_trecv");
    if (one(&c, &e, LIMIT_S) != 1 || c.op_context != &rctx || in[0] != 9)
        DIE("kill: bystander: no message from the survivor");
    while (fi_tsend(ep, out, sizeof out, NULL, s, 3, &sctx) == -FI_EAGAIN)
        (void) fi_cq_read(cq, NULL, 0);
    if (one(&c, &e, LIMIT_S) != 1 || c.op_context != &sctx)
        DIE("kill: bystander: the answer did not complete");
    close_all();
    printf("kill: bystander: answered\n");
}

static void survivor(const char *dir)
{
    static uint8_t buf[WINDOW][BIG];
    static int ctx[WINDOW];
    struct fi_cq_tagged_entry c;
    struct fi_cq_err_entry e;
    publish(dir, "survivor");
    fi_addr_t v = peer(dir, "victim"), b = peer(dir, "bystander");
    for (int i = 0; i < WINDOW; i++) {
        memset(buf[i], i, BIG);
        if (fi_tsend(ep, buf[i], BIG, NULL, v, 1, &ctx[i]))
            DIE("kill: survivor: fi_tsend");
    }
    /* Sends go on until they fail: each completion posts the next. */
    int done = 0, failed = 0, pending = WINDOW;
    double first_error = 0;
    while (pending > 0) {
        int r = one(&c, &e, LIMIT_S);
        if (r < 0)
            DIE("kill: survivor: %d sends still pending after %d s (the harness's limit)", pending, LIMIT_S);
        pending--;
        if (r == 0) {
            if (!failed++) {
                first_error = now_s();
                printf("kill: survivor: first error: %s (prov_errno %d: %s)\n", fi_strerror(e.err), e.prov_errno,
                       fi_cq_strerror(cq, e.prov_errno, e.err_data, NULL, 0));
                fflush(stdout);
            }
            CHECK(e.err != 0 && e.op_context >= (void *) ctx && e.op_context < (void *) (ctx + WINDOW),
                  "an error completion for a send: err %d, context %p", e.err, e.op_context);
            continue;
        }
        if (++done == FLOWING) {
            printf("flowing\n");
            fflush(stdout);
        }
        if (failed)
            continue;
        int i = (int) ((int *) c.op_context - ctx);
        int rc;
        while ((rc = fi_tsend(ep, buf[i], BIG, NULL, v, 1, &ctx[i])) == -FI_EAGAIN)
            (void) fi_cq_read(cq, NULL, 0);
        if (rc == 0)
            pending++;
        else
            CHECK(rc == -FI_EIO || rc == -FI_ECONNRESET || rc == -FI_EINVAL,
                  "a send to the dead peer is refused, not hung: %d", rc);
    }
    CHECK(failed > 0, "%d sends completed, none failed", done);
    printf("kill: survivor: %d sends completed, %d failed; the last failure %.2f s after the first\n", done, failed,
           now_s() - first_error);
    /* The bystander still hears, and answers. */
    uint8_t in[8] = {0}, out[8] = {9, 9, 9, 9, 9, 9, 9, 9};
    int rctx, sctx;
    CHECK(fi_trecv(ep, in, sizeof in, NULL, FI_ADDR_UNSPEC, 3, 0, &rctx) == 0, "fi_trecv from the bystander");
    CHECK(fi_tsend(ep, out, sizeof out, NULL, b, 2, &sctx) == 0, "fi_tsend to the bystander");
    int got = 0;
    for (int k = 0; k < 2; k++) {
        int r = one(&c, &e, LIMIT_S);
        CHECK(r == 1, "the bystander exchange: %d (%s)", r, r == 0 ? fi_strerror(e.err) : "timeout");
        got += r == 1;
    }
    CHECK(got == 2 && in[0] == 7, "the bystander's answer");
    close_all();
    printf("kill: survivor: the bystander answered after the failure\n");
}

int main(int argc, char **argv)
{
    if (argc != 3)
        DIE("usage: kill survivor|victim|bystander DIR");
    open_all(FI_TAGGED);
    if (!strcmp(argv[1], "survivor"))
        survivor(argv[2]);
    else if (!strcmp(argv[1], "victim"))
        victim(argv[2]);
    else if (!strcmp(argv[1], "bystander"))
        bystander(argv[2]);
    else
        DIE("kill: unknown role %s", argv[1]);
    if (failures) {
        fprintf(stderr, "kill: %s: %d failures\n", argv[1], failures);
        return 1;
    }
    return 0;
}
