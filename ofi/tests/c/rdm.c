/*
 * Messages through the provider with libfabric's API alone, three
 * endpoints in one process, each on a domain of its own: on the simulated
 * fabric (XRCBTL_OFI_FABRIC=sim; scripts/test-ofi) or on one verbs device
 * (scripts/guest-ofi): fi_getinfo -> fabric -> domains -> av -> cq -> ep ->
 * send/recv, tagged and untagged -> close.
 *
 * On the simulated fabric endpoint A is on node 0, B on node 0 too (the
 * XRC node's shared domain), C on node 1; on verbs all three are ranks of
 * the one host. Every size 0, each power of two from 1 B to 4 MiB
 * and one byte either side goes A -> C tagged (half with the receive
 * posted first, half after: unexpected), with every byte checked and
 * nothing written past the message; then A -> B untagged; then remote CQ
 * data, inject, a send that completes only once delivered, FI_SOURCE, a truncated receive (FI_ETRUNC with olen), a
 * cancelled one (FI_ECANCELED), a directed receive that takes only its
 * source, a tag mask, a multi-receive buffer, and FI_PEEK, FI_CLAIM and
 * FI_DISCARD; then RMA
 * writes and reads of memory C registered (every byte checked), an inject
 * write, a write with remote CQ data, and refusals (a wrong key, a range
 * past the registration) that
 * leave the endpoints usable; then fi_query_atomic's answers and the
 * atomics it offers, with A and B adding to one word of C's at once; last,
 * one thread sending while another receives.
 *
 *   rdm [noatomics]   (XRCBTL_OFI_SIM_NODES=2 XRCBTL_OFI_SIM_RANKS_PER_NODE=2;
 *                      noatomics: a device without them, as siw)
 */
#define _POSIX_C_SOURCE 200809L
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"

struct side {
    struct fid_domain *domain;
    struct fid_av *av;
    struct fid_cq *cq;
    struct fid_ep *ep;
    fi_addr_t peer[3]; /* every side's address in this side's vector */
};

static struct side s[3];

static void open_side(struct fid_fabric *fabric, struct fi_info *info, struct side *x)
{
    struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
    struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_TAGGED, .size = 64};
    int rc;
    if ((rc = fi_domain(fabric, info, &x->domain, NULL)) || (rc = fi_av_open(x->domain, &av_attr, &x->av, NULL)) ||
        (rc = fi_cq_open(x->domain, &cq_attr, &x->cq, NULL)) || (rc = fi_endpoint(x->domain, info, &x->ep, NULL)) ||
        (rc = fi_ep_bind(x->ep, &x->av->fid, 0)) || (rc = fi_ep_bind(x->ep, &x->cq->fid, FI_TRANSMIT | FI_RECV)) ||
        (rc = fi_enable(x->ep)))
        DIE("rdm: opening a side: %s", fi_strerror(-rc));
}

/* The harness's limit on one wait, which only a hung run reaches: every
 * wait follows completions, however slowly the device runs. */
enum { LIMIT_S = 300 };

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double) t.tv_sec + (double) t.tv_nsec / 1e9;
}

/* Drives every side's progress (FI_PROGRESS_MANUAL: reading a queue does,
 * and a read of no entries takes none). On the simulated fabric any read
 * steps the whole job; on verbs each domain is a rank of its own, and a
 * side waiting for a peer of the same process must let that peer work. */
static void progress_all(void)
{
    for (int i = 0; i < 3; i++)
        if (s[i].cq)
            (void) fi_cq_read(s[i].cq, NULL, 0);
}

/* Reads one completion for `context` from side x's queue (driving every
 * side's progress meanwhile). An error completion is returned in *err. */
static int wait_for(struct side *x, void *context, struct fi_cq_tagged_entry *out, fi_addr_t *src,
                    struct fi_cq_err_entry *err)
{
    for (double end = now_s() + LIMIT_S; now_s() < end;) {
        progress_all();
        fi_addr_t from = FI_ADDR_NOTAVAIL;
        ssize_t n = fi_cq_readfrom(x->cq, out, 1, &from);
        if (n == 1) {
            if (out->op_context != context)
                DIE("rdm: completion for %p while waiting for %p", out->op_context, context);
            if (src)
                *src = from;
            return 0;
        }
        if (n == -FI_EAVAIL) {
            memset(err, 0, sizeof *err);
            if (fi_cq_readerr(x->cq, err, 0) != 1)
                DIE("rdm: readerr");
            if (err->op_context != context)
                DIE("rdm: error for %p while waiting for %p", err->op_context, context);
            return -err->err;
        }
        if (n != -FI_EAGAIN)
            DIE("rdm: fi_cq_read: %s", fi_strerror((int) -n));
    }
    DIE("rdm: no completion for %p within %d s (the harness's limit)", context, LIMIT_S);
}

static void fill(uint8_t *b, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++)
        b[i] = (uint8_t) (i * 131 + seed);
}

/* One message of `len` bytes from x to y, checked; with `gather`, sent from
 * three I/O vector entries (1 byte, half the rest, and the rest). */
static void one(struct side *x, struct side *y, int yi, size_t len, int tagged, int early, unsigned seed,
                int gather)
{
    uint8_t *src = malloc(len + 1), *dst = malloc(len + 2);
    fill(src, len, seed);
    memset(dst, 0xEE, len + 2);
    struct fi_cq_tagged_entry e;
    struct fi_cq_err_entry ee;
    int rctx, sctx;
    uint64_t tag = 0x1000 + seed;
    ssize_t rc;
#define RECV()                                                                                             \
    (tagged ? fi_trecv(y->ep, dst, len + 1, NULL, FI_ADDR_UNSPEC, tag, 0, &rctx)                           \
            : fi_recv(y->ep, dst, len + 1, NULL, FI_ADDR_UNSPEC, &rctx))
    if (early)
        CHECK((rc = RECV()) == 0, "recv: %zd", rc);
    if (gather && len >= 2) {
        size_t half = (len - 1) / 2;
        struct iovec v[3] = {{src, 1}, {src + 1, half}, {src + 1 + half, len - 1 - half}};
        rc = tagged ? fi_tsendv(x->ep, v, NULL, 3, x->peer[yi], tag, &sctx)
                    : fi_sendv(x->ep, v, NULL, 3, x->peer[yi], &sctx);
    } else {
        rc = tagged ? fi_tsend(x->ep, src, len, NULL, x->peer[yi], tag, &sctx)
                    : fi_send(x->ep, src, len, NULL, x->peer[yi], &sctx);
    }
    CHECK(rc == 0, "send of %zu B: %s", len, fi_strerror((int) -rc));
    if (!early)
        CHECK((rc = RECV()) == 0, "late recv: %zd", rc);
#undef RECV
    fi_addr_t from;
    int r = wait_for(y, &rctx, &e, &from, &ee);
    CHECK(r == 0, "receive of %zu B: %s", len, fi_strerror(-r));
    if (r == 0) {
        CHECK(e.len == len, "%zu B arrived as %zu", len, e.len);
        CHECK(e.flags == (FI_RECV | (tagged ? FI_TAGGED : FI_MSG)), "flags %#llx", (unsigned long long) e.flags);
        CHECK(!tagged || e.tag == tag, "tag %#llx", (unsigned long long) e.tag);
        CHECK(e.buf == dst, "buf %p, not %p", e.buf, (void *) dst);
        int xi = (int) (x - s);
        CHECK(from == y->peer[xi], "FI_SOURCE %llu, not %llu", (unsigned long long) from,
              (unsigned long long) y->peer[xi]);
        CHECK(!memcmp(dst, src, len), "%zu B: the bytes differ", len);
        CHECK(dst[len] == 0xEE && dst[len + 1] == 0xEE, "%zu B: written past the message", len);
    }
    r = wait_for(x, &sctx, &e, NULL, &ee);
    CHECK(r == 0 && e.flags == (FI_SEND | (tagged ? FI_TAGGED : FI_MSG)), "send completion of %zu B: %d", len, r);
    free(src);
    free(dst);
}

static void special(void)
{
    struct side *a = &s[0], *c = &s[2];
    struct fi_cq_tagged_entry e;
    struct fi_cq_err_entry ee;
    uint8_t buf[256], out[256];
    fill(buf, sizeof buf, 9);
    int rctx, sctx;

    /* Remote CQ data. */
    CHECK(fi_trecv(c->ep, out, sizeof out, NULL, FI_ADDR_UNSPEC, 5, 0, &rctx) == 0, "trecv");
    CHECK(fi_tsenddata(a->ep, buf, 10, NULL, 0xfeedbeef, a->peer[2], 5, &sctx) == 0, "tsenddata");
    CHECK(wait_for(c, &rctx, &e, NULL, &ee) == 0 && (e.flags & FI_REMOTE_CQ_DATA) && e.data == 0xfeedbeef,
          "CQ data %#llx, flags %#llx", (unsigned long long) e.data, (unsigned long long) e.flags);
    CHECK(wait_for(a, &sctx, &e, NULL, &ee) == 0, "tsenddata completion");

    /* Inject: no completion at the sender, the bytes arrive. */
    CHECK(fi_recv(c->ep, out, sizeof out, NULL, FI_ADDR_UNSPEC, &rctx) == 0, "recv");
    CHECK(fi_inject(a->ep, buf, 64, a->peer[2]) == 0, "inject");
    memset(buf, 0, 64); /* reusable at once */
    CHECK(wait_for(c, &rctx, &e, NULL, &ee) == 0 && e.len == 64, "inject arrived");
    fill(buf, sizeof buf, 9);
    CHECK(!memcmp(out, buf, 64), "inject's bytes");
    CHECK(fi_cq_read(a->cq, &e, 1) == -FI_EAGAIN, "inject completes nothing");
    CHECK(fi_inject(a->ep, buf, 8192, a->peer[2]) == -FI_EINVAL, "inject past inject_size");
    /* FI_INJECT as a send's flag: the buffer is reusable at once, and the
     * send still completes (only the inject calls complete nothing). */
    struct iovec iiov = {.iov_base = buf, .iov_len = 48};
    struct fi_msg imsg = {.msg_iov = &iiov, .iov_count = 1, .addr = a->peer[2], .context = &sctx};
    CHECK(fi_recv(c->ep, out, sizeof out, NULL, FI_ADDR_UNSPEC, &rctx) == 0, "recv");
    CHECK(fi_sendmsg(a->ep, &imsg, FI_INJECT | FI_COMPLETION) == 0, "fi_sendmsg with FI_INJECT");
    memset(buf, 0, 48);
    CHECK(wait_for(a, &sctx, &e, NULL, &ee) == 0 && e.flags == (FI_SEND | FI_MSG), "FI_INJECT's send completes");
    CHECK(wait_for(c, &rctx, &e, NULL, &ee) == 0 && e.len == 48, "FI_INJECT's send arrived");
    fill(buf, sizeof buf, 9);
    CHECK(!memcmp(out, buf, 48), "FI_INJECT's bytes, copied at the call");

    /* FI_TRANSMIT_COMPLETE (as FI_DELIVERY_COMPLETE): the send completes
     * only once the receiver has the message, here once its receive is
     * posted. */
    struct iovec tiov = {.iov_base = buf, .iov_len = 32};
    struct fi_msg_tagged tmsg = {.msg_iov = &tiov, .iov_count = 1, .addr = a->peer[2], .tag = 31, .context = &sctx};
    CHECK(fi_tsendmsg(a->ep, &tmsg, FI_TRANSMIT_COMPLETE | FI_COMPLETION) == 0, "tsendmsg");
    for (int i = 0; i < 20000; i++) {
        CHECK(fi_cq_read(a->cq, &e, 1) == -FI_EAGAIN, "complete before the receiver has it");
        (void) fi_cq_read(c->cq, &e, 1);
    }
    CHECK(fi_trecv(c->ep, out, sizeof out, NULL, FI_ADDR_UNSPEC, 31, 0, &rctx) == 0, "trecv");
    CHECK(wait_for(c, &rctx, &e, NULL, &ee) == 0 && e.len == 32, "received");
    CHECK(wait_for(a, &sctx, &e, NULL, &ee) == 0, "then the send completes");

    /* Truncation. */
    CHECK(fi_trecv(c->ep, out, 100, NULL, FI_ADDR_UNSPEC, 6, 0, &rctx) == 0, "short trecv");
    CHECK(fi_tsend(a->ep, buf, 200, NULL, a->peer[2], 6, &sctx) == 0, "tsend");
    int r = wait_for(c, &rctx, &e, NULL, &ee);
    CHECK(r == -FI_ETRUNC && ee.olen == 100 && ee.len == 100, "truncation: %d, olen %zu, len %zu", r, ee.olen,
          ee.len);
    const char *why = fi_cq_strerror(c->cq, ee.prov_errno, ee.err_data, NULL, 0);
    CHECK(why && strstr(why, "smaller"), "strerror: %s", why ? why : "(null)");
    CHECK(wait_for(a, &sctx, &e, NULL, &ee) == 0, "the truncated send completes");

    /* Cancel. */
    CHECK(fi_trecv(c->ep, out, 100, NULL, FI_ADDR_UNSPEC, 7, 0, &rctx) == 0, "trecv to cancel");
    CHECK(fi_cancel(&c->ep->fid, &rctx) == 0, "cancel");
    CHECK(fi_cancel(&c->ep->fid, &rctx) == -FI_ENOENT, "cancel twice");
    CHECK(wait_for(c, &rctx, &e, NULL, &ee) == -FI_ECANCELED, "cancelled");

    /* A directed receive takes only its source; a mask ignores bits. */
    int from_b, any;
    CHECK(fi_trecv(c->ep, out, 100, NULL, c->peer[1], 8, 0, &from_b) == 0, "directed trecv");
    CHECK(fi_trecv(c->ep, out + 128, 100, NULL, FI_ADDR_UNSPEC, 0x708, 0x700, &any) == 0, "masked trecv");
    CHECK(fi_tsend(a->ep, buf, 3, NULL, a->peer[2], 8, &sctx) == 0, "tsend from A");
    r = wait_for(c, &any, &e, NULL, &ee);
    CHECK(r == 0 && e.tag == 8, "A's message of tag 8 takes the masked receive (0x708 ignoring 0x700): %d", r);
    CHECK(wait_for(a, &sctx, &e, NULL, &ee) == 0, "A's send");
    struct side *b = &s[1];
    CHECK(fi_tsend(b->ep, buf, 4, NULL, b->peer[2], 8, &sctx) == 0, "tsend from B");
    r = wait_for(c, &from_b, &e, NULL, &ee);
    CHECK(r == 0 && e.len == 4, "B's message takes the receive directed to B: %d", r);
    CHECK(wait_for(b, &sctx, &e, NULL, &ee) == 0, "B's send");
    CHECK(fi_tsend(a->ep, buf, 4, NULL, 77, 8, &sctx) == -FI_EINVAL, "an address not in the vector");

    /* A multi-receive buffer (MPICH's active messages): messages land one
     * after the other in it, each with its own completion, and the one
     * after which less than FI_OPT_MIN_MULTI_RECV is free releases it
     * (FI_MULTI_RECV). */
    size_t min_free = 1024;
    CHECK(fi_setopt(&c->ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &min_free, sizeof min_free) == 0,
          "min_multi_recv");
    uint8_t *mbuf = calloc(1, 4096);
    struct fi_context mctx;
    struct iovec miov = {.iov_base = mbuf, .iov_len = 4096};
    struct fi_msg mm = {.msg_iov = &miov, .iov_count = 1, .addr = FI_ADDR_UNSPEC, .context = &mctx};
    CHECK(fi_recvmsg(c->ep, &mm, FI_MULTI_RECV) == 0, "post a multi-receive buffer");
    for (int k = 0; k < 5; k++) {
        fill(buf, 200, (unsigned) k);
        CHECK(fi_send(a->ep, buf, 200, NULL, a->peer[2], &sctx) == 0, "send %d", k);
        CHECK(wait_for(a, &sctx, &e, NULL, &ee) == 0, "sent %d", k);
    }
    for (int k = 0; k < 5; k++) {
        r = wait_for(c, &mctx, &e, NULL, &ee);
        fill(buf, 200, (unsigned) k);
        CHECK(r == 0 && e.len == 200 && e.buf == mbuf + 200 * k && !memcmp(e.buf, buf, 200),
              "message %d at offset %td", k, (uint8_t *) e.buf - mbuf);
        CHECK(!(e.flags & FI_MULTI_RECV), "not released after %d messages", k + 1);
    }
    /* More of 200 B: the 16th, after which 896 B are free, releases it. */
    for (int k = 5; k < 20; k++) {
        CHECK(fi_send(a->ep, buf, 200, NULL, a->peer[2], &sctx) == 0, "send %d", k);
        CHECK(wait_for(a, &sctx, &e, NULL, &ee) == 0, "sent %d", k);
        r = wait_for(c, &mctx, &e, NULL, &ee);
        int last = 4096 - 200 * (k + 1) < 1024;
        CHECK(r == 0 && e.buf == mbuf + 200 * k && !!(e.flags & FI_MULTI_RECV) == last,
              "message %d: flags %#llx", k, (unsigned long long) e.flags);
        if (last)
            break;
    }
    free(mbuf);

    /* FI_PEEK, FI_CLAIM, FI_DISCARD (MPI_Probe, MPI_Mprobe/Mrecv). */
    struct fi_context peek_ctx, claim_ctx, drop_ctx;
    struct iovec iov = {.iov_base = out, .iov_len = sizeof out};
    struct fi_msg_tagged m = {.msg_iov = &iov, .iov_count = 1, .addr = FI_ADDR_UNSPEC, .tag = 9};
    m.context = &peek_ctx;
    CHECK(fi_trecvmsg(c->ep, &m, FI_PEEK) == 0, "peek");
    CHECK(wait_for(c, &peek_ctx, &e, NULL, &ee) == -FI_ENOMSG, "nothing to peek at yet");
    /* With remote CQ data, which MPICH reads the sender's rank from when
     * it probes. */
    CHECK(fi_tsenddata(a->ep, buf, 40, NULL, 0x5eed, a->peer[2], 9, &sctx) == 0, "tsenddata tag 9");
    CHECK(wait_for(a, &sctx, &e, NULL, &ee) == 0, "sent");
    for (int tries = 0;; tries++) {
        m.context = &claim_ctx;
        CHECK(fi_trecvmsg(c->ep, &m, FI_PEEK | FI_CLAIM) == 0, "peek and claim");
        r = wait_for(c, &claim_ctx, &e, NULL, &ee);
        if (r != -FI_ENOMSG || tries > 1000)
            break;
    }
    CHECK(r == 0 && e.len == 40 && e.tag == 9 && (e.flags & FI_REMOTE_CQ_DATA) && e.data == 0x5eed,
          "peeked: %d, %zu B, tag %llu, data %#llx", r, e.len, (unsigned long long) e.tag,
          (unsigned long long) e.data);
    m.context = &peek_ctx;
    CHECK(fi_trecvmsg(c->ep, &m, FI_PEEK) == 0, "peek again");
    CHECK(wait_for(c, &peek_ctx, &e, NULL, &ee) == -FI_ENOMSG, "a claimed message is no one else's");
    memset(out, 0, sizeof out);
    m.context = &claim_ctx;
    CHECK(fi_trecvmsg(c->ep, &m, FI_CLAIM) == 0, "receive the claimed message");
    CHECK(wait_for(c, &claim_ctx, &e, NULL, &ee) == 0 && e.len == 40 && !memcmp(out, buf, 40) && e.data == 0x5eed,
          "claimed bytes and data");
    m.context = &claim_ctx;
    CHECK(fi_trecvmsg(c->ep, &m, FI_CLAIM) == -FI_EINVAL, "nothing claimed any more");

    for (int how = 0; how < 2; how++) {
        uint64_t tag = 10 + (uint64_t) how;
        CHECK(fi_tsend(a->ep, buf, 16, NULL, a->peer[2], tag, &sctx) == 0, "tsend to drop");
        CHECK(wait_for(a, &sctx, &e, NULL, &ee) == 0, "sent");
        m.tag = tag;
        for (int tries = 0;; tries++) {
            m.context = &drop_ctx;
            /* 0: peek and drop at once; 1: claim, then drop the claimed. */
            CHECK(fi_trecvmsg(c->ep, &m, how ? FI_PEEK | FI_CLAIM : FI_PEEK | FI_DISCARD) == 0, "peek");
            r = wait_for(c, &drop_ctx, &e, NULL, &ee);
            if (r != -FI_ENOMSG || tries > 1000)
                break;
        }
        CHECK(r == 0 && e.len == 16, "found the message to drop: %d", r);
        if (how) {
            CHECK(fi_trecvmsg(c->ep, &m, FI_CLAIM | FI_DISCARD) == 0, "drop the claimed");
            CHECK(wait_for(c, &drop_ctx, &e, NULL, &ee) == 0, "dropped");
        }
        CHECK(fi_trecv(c->ep, out, sizeof out, NULL, FI_ADDR_UNSPEC, tag, 0, &rctx) == 0, "trecv of a dropped tag");
        CHECK(fi_cancel(&c->ep->fid, &rctx) == 0 && wait_for(c, &rctx, &e, NULL, &ee) == -FI_ECANCELED,
              "the dropped message is gone (%d)", how);
    }
}

/* RMA: A writes into and reads from memory C registered. */
static void rma(void)
{
    struct side *a = &s[0], *c = &s[2];
    const size_t win_len = 1u << 20;
    uint8_t *win = calloc(1, win_len), *src = malloc(win_len), *back = malloc(win_len);
    struct fid_mr *mr = NULL;
    int rc = fi_mr_reg(c->domain, win, win_len, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &mr, NULL);
    CHECK(rc == 0, "fi_mr_reg: %s", fi_strerror(-rc));
    if (rc)
        return;
    CHECK(fi_mr_desc(mr) == NULL, "no local descriptor is needed");
    uint64_t key = fi_mr_key(mr), base = (uint64_t) (uintptr_t) win;
    struct fi_cq_tagged_entry e;
    struct fi_cq_err_entry ee;
    int ctx;
    const size_t sizes[] = {1, 8, 4095, 4096, 65537, win_len - 64};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t len = sizes[i], off = (i * 8) % 64;
        fill(src, len, (unsigned) i + 40);
        CHECK(fi_write(a->ep, src, len, NULL, a->peer[2], base + off, key, &ctx) == 0, "fi_write %zu B", len);
        int r = wait_for(a, &ctx, &e, NULL, &ee);
        CHECK(r == 0 && e.flags == (FI_RMA | FI_WRITE), "write of %zu B: %d, flags %#llx", len, r,
              (unsigned long long) e.flags);
        CHECK(!memcmp(win + off, src, len), "%zu B written", len);
        memset(back, 0, len);
        CHECK(fi_read(a->ep, back, len, NULL, a->peer[2], base + off, key, &ctx) == 0, "fi_read %zu B", len);
        r = wait_for(a, &ctx, &e, NULL, &ee);
        CHECK(r == 0 && e.flags == (FI_RMA | FI_READ), "read of %zu B: %d", len, r);
        CHECK(!memcmp(back, src, len), "%zu B read back", len);
    }
    /* An inject: no completion; the bytes land. */
    uint8_t small[16];
    fill(small, sizeof small, 99);
    CHECK(fi_inject_write(a->ep, small, sizeof small, a->peer[2], base + 100, key) == 0, "fi_inject_write");
    memset(small, 0, sizeof small);
    fill(back, sizeof small, 99);
    int landed = 0;
    for (double end = now_s() + LIMIT_S; now_s() < end && !landed;) {
        progress_all();
        CHECK(fi_cq_read(a->cq, &e, 1) == -FI_EAGAIN, "an inject completes nothing");
        landed = !memcmp(win + 100, back, sizeof small);
    }
    CHECK(landed, "the injected bytes landed");
    /* A write with remote CQ data: the target endpoint hears of it, from
     * A, once the bytes are there, and no receive of its is taken. */
    fill(src, 300, 5);
    CHECK(fi_writedata(a->ep, src, 300, NULL, 0xabcdef, a->peer[2], base + 512, key, &ctx) == 0, "fi_writedata");
    CHECK(wait_for(a, &ctx, &e, NULL, &ee) == 0 && e.flags == (FI_RMA | FI_WRITE), "writedata completes");
    fi_addr_t from = 0;
    CHECK(wait_for(c, NULL, &e, &from, &ee) == 0, "the target's notice");
    CHECK(e.flags == (FI_RMA | FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA) && e.data == 0xabcdef && from == c->peer[0],
          "notice: flags %#llx, data %#llx, from %llu", (unsigned long long) e.flags, (unsigned long long) e.data,
          (unsigned long long) from);
    CHECK(!memcmp(win + 512, src, 300), "the bytes before the notice");

    /* A key the target never gave: the device refuses, the caller hears. */
    CHECK(fi_write(a->ep, src, 64, NULL, a->peer[2], base, key + 1, &ctx) == 0, "fi_write with a wrong key");
    int r = wait_for(a, &ctx, &e, NULL, &ee);
    CHECK(r != 0, "a write with a wrong key completes in error");
    /* One byte past the registration (inside its last page): refused
     * too, as fi_mr_reg registers exactly the bytes asked for. */
    CHECK(fi_read(a->ep, back, 8, NULL, a->peer[2], base + win_len - 7, key, &ctx) == 0,
          "fi_read one byte past the end");
    r = wait_for(a, &ctx, &e, NULL, &ee);
    CHECK(r != 0, "a read one byte past the registration completes in error");
    CHECK(fi_read(a->ep, back, 8, NULL, a->peer[2], base + win_len - 8, key, &ctx) == 0,
          "fi_read of the last 8 bytes");
    r = wait_for(a, &ctx, &e, NULL, &ee);
    CHECK(r == 0, "a read of the registration's last bytes: %d", r);
    /* After the refusals, good work still goes through. */
    fill(src, 32, 7);
    CHECK(fi_write(a->ep, src, 32, NULL, a->peer[2], base, key, &ctx) == 0, "fi_write after the refusals");
    r = wait_for(a, &ctx, &e, NULL, &ee);
    CHECK(r == 0 && !memcmp(win, src, 32), "a good write after the refusals: %d", r);
    CHECK(fi_close(&mr->fid) == 0, "fi_close(mr)");
    free(win);
    free(src);
    free(back);
}

/* A registration past a device's largest region (rxe registers at most
 * 1 GiB - 4 KiB): the provider registers it as several device regions
 * under one key, and a peer's transfers and atomics across the boundary
 * between two of them land whole. The boundary lies within the 64 KiB
 * around offset 1 GiB - 8 KiB wherever the buffer starts. */
static void big_region(int with_atomics)
{
    struct side *a = &s[0], *c = &s[2];
    const size_t big = (1u << 30) + (64u << 10), len = 64u << 10, off = (1u << 30) - (8u << 10) - 30000;
    uint8_t *win = malloc(big), *src = malloc(len), *back = calloc(1, len);
    CHECK(win && src && back, "memory for a 1 GiB region");
    if (!win || !src || !back)
        return;
    struct fid_mr *mr = NULL;
    int rc = fi_mr_reg(c->domain, win, big, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &mr, NULL);
    CHECK(rc == 0, "fi_mr_reg of %zu B: %s", big, fi_strerror(-rc));
    if (rc == 0) {
        uint64_t key = fi_mr_key(mr), base = (uint64_t) (uintptr_t) win;
        struct fi_cq_tagged_entry e;
        struct fi_cq_err_entry ee;
        int ctx;
        fill(src, len, 77);
        CHECK(fi_write(a->ep, src, len, NULL, a->peer[2], base + off, key, &ctx) == 0, "fi_write across regions");
        CHECK(wait_for(a, &ctx, &e, NULL, &ee) == 0, "the write across regions completes");
        CHECK(!memcmp(win + off, src, len), "the write across regions landed whole");
        CHECK(fi_read(a->ep, back, len, NULL, a->peer[2], base + off, key, &ctx) == 0, "fi_read across regions");
        CHECK(wait_for(a, &ctx, &e, NULL, &ee) == 0 && !memcmp(back, src, len), "read back across regions");
        if (with_atomics) {
            uint64_t *word = (uint64_t *) (win + (1u << 30)), add = 5, old = 0;
            *word = 37;
            CHECK(fi_fetch_atomic(a->ep, &add, 1, NULL, &old, NULL, a->peer[2], base + (1u << 30), key, FI_UINT64,
                                  FI_SUM, &ctx) == 0,
                  "fi_fetch_atomic past 1 GiB");
            CHECK(wait_for(a, &ctx, &e, NULL, &ee) == 0 && old == 37 && *word == 42,
                  "the atomic past 1 GiB: old %llu, now %llu", (unsigned long long) old, (unsigned long long) *word);
        }
        CHECK(fi_close(&mr->fid) == 0, "fi_close(big mr)");
    }
    free(win);
    free(src);
    free(back);
}

/* Atomics on a word of C's, from A (and B, at once). */
static void atomics(void)
{
    struct side *a = &s[0], *b = &s[1], *c = &s[2];
    struct fi_atomic_attr attr = {0};
    CHECK(fi_query_atomic(a->domain, FI_UINT64, FI_SUM, &attr, 0) == 0 && attr.count == 1 && attr.size == 8,
          "query SUM");
    CHECK(fi_query_atomic(a->domain, FI_INT64, FI_SUM, &attr, FI_FETCH_ATOMIC) == 0, "query fetching SUM");
    CHECK(fi_query_atomic(a->domain, FI_UINT64, FI_CSWAP, &attr, FI_COMPARE_ATOMIC) == 0, "query CSWAP");
    CHECK(fi_query_atomic(a->domain, FI_UINT64, FI_ATOMIC_READ, &attr, FI_FETCH_ATOMIC) == 0, "query READ");
    CHECK(fi_query_atomic(a->domain, FI_UINT64, FI_ATOMIC_WRITE, &attr, FI_FETCH_ATOMIC) == -FI_EOPNOTSUPP,
          "no swap");
    CHECK(fi_query_atomic(a->domain, FI_UINT32, FI_SUM, &attr, 0) == -FI_EOPNOTSUPP, "no 32-bit");
    CHECK(fi_query_atomic(a->domain, FI_UINT64, FI_PROD, &attr, 0) == -FI_EOPNOTSUPP, "no product");
    CHECK(fi_query_atomic(a->domain, FI_UINT64, FI_SUM, &attr, 1) == -FI_EBADFLAGS, "bad flags");
    size_t n = 0;
    CHECK(fi_atomicvalid(a->ep, FI_UINT64, FI_SUM, &n) == 0 && n == 1, "atomicvalid");
    CHECK(fi_compare_atomicvalid(a->ep, FI_UINT64, FI_CSWAP, &n) == 0, "compare_atomicvalid");
    CHECK(fi_fetch_atomicvalid(a->ep, FI_UINT64, FI_MIN, &n) == -FI_EOPNOTSUPP, "no fetching MIN");

    uint64_t *words = aligned_alloc(4096, 4096);
    memset(words, 0, 4096);
    struct fid_mr *mr;
    int rc = fi_mr_reg(c->domain, words, 4096, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &mr, NULL);
    CHECK(rc == 0, "fi_mr_reg: %s", fi_strerror(-rc));
    if (rc)
        return;
    uint64_t key = fi_mr_key(mr), at = (uint64_t) (uintptr_t) &words[1];
    words[1] = 10;
    struct fi_cq_tagged_entry e;
    struct fi_cq_err_entry ee;
    int ctx;
    uint64_t v = 5, old = 0, cmp;
    CHECK(fi_atomic(a->ep, &v, 1, NULL, a->peer[2], at, key, FI_UINT64, FI_SUM, &ctx) == 0, "fi_atomic");
    CHECK(wait_for(a, &ctx, &e, NULL, &ee) == 0 && e.flags == (FI_ATOMIC | FI_WRITE) && words[1] == 15,
          "add: %llu, flags %#llx", (unsigned long long) words[1], (unsigned long long) e.flags);
    v = 3;
    CHECK(fi_fetch_atomic(a->ep, &v, 1, NULL, &old, NULL, a->peer[2], at, key, FI_UINT64, FI_SUM, &ctx) == 0, "fetch");
    CHECK(wait_for(a, &ctx, &e, NULL, &ee) == 0 && e.flags == (FI_ATOMIC | FI_READ) && old == 15 && words[1] == 18,
          "fetch-add: old %llu, now %llu", (unsigned long long) old, (unsigned long long) words[1]);
    CHECK(fi_fetch_atomic(a->ep, NULL, 1, NULL, &old, NULL, a->peer[2], at, key, FI_UINT64, FI_ATOMIC_READ, &ctx) == 0,
          "atomic read");
    CHECK(wait_for(a, &ctx, &e, NULL, &ee) == 0 && old == 18 && words[1] == 18, "read: %llu", (unsigned long long) old);
    v = 100;
    cmp = 18;
    CHECK(fi_compare_atomic(a->ep, &v, 1, NULL, &cmp, NULL, &old, NULL, a->peer[2], at, key, FI_UINT64, FI_CSWAP,
                            &ctx) == 0,
          "cswap");
    CHECK(wait_for(a, &ctx, &e, NULL, &ee) == 0 && old == 18 && words[1] == 100, "cswap that matches");
    cmp = 5;
    v = 7;
    CHECK(fi_compare_atomic(a->ep, &v, 1, NULL, &cmp, NULL, &old, NULL, a->peer[2], at, key, FI_UINT64, FI_CSWAP,
                            &ctx) == 0,
          "cswap");
    CHECK(wait_for(a, &ctx, &e, NULL, &ee) == 0 && old == 100 && words[1] == 100, "cswap that does not");
    CHECK(fi_atomic(a->ep, &v, 1, NULL, a->peer[2], at + 4, key, FI_UINT64, FI_SUM, &ctx) == -FI_EINVAL,
          "a misaligned target");
    CHECK(fi_atomic(a->ep, &v, 2, NULL, a->peer[2], at, key, FI_UINT64, FI_SUM, &ctx) == -FI_EINVAL,
          "two elements");
    CHECK(fi_atomic(a->ep, &v, 1, NULL, a->peer[2], at, key, FI_UINT64, FI_ATOMIC_WRITE, &ctx) == -FI_EOPNOTSUPP,
          "a swap");

    /* A and B fetch-and-add 1 on one word, their operations interleaved:
     * every value they fetch is different, and none is lost. */
    enum { N = 64 };
    words[2] = 1000;
    uint64_t one = 1, got_a[N], got_b[N];
    int ca[N], cb[N];
    at = (uint64_t) (uintptr_t) &words[2];
    for (int i = 0; i < N; i++) {
        CHECK(fi_fetch_atomic(a->ep, &one, 1, NULL, &got_a[i], NULL, a->peer[2], at, key, FI_UINT64, FI_SUM, &ca[i]) ==
                  0,
              "A's fetch-add");
        CHECK(fi_fetch_atomic(b->ep, &one, 1, NULL, &got_b[i], NULL, b->peer[2], at, key, FI_UINT64, FI_SUM, &cb[i]) ==
                  0,
              "B's fetch-add");
    }
    for (int i = 0; i < N; i++) {
        CHECK(wait_for(a, &ca[i], &e, NULL, &ee) == 0, "A's %d", i);
        CHECK(wait_for(b, &cb[i], &e, NULL, &ee) == 0, "B's %d", i);
    }
    CHECK(words[2] == 1000 + 2 * N, "the word: %llu", (unsigned long long) words[2]);
    uint8_t seen[2 * N] = {0};
    for (int i = 0; i < N; i++) {
        uint64_t x[2] = {got_a[i], got_b[i]};
        for (int k = 0; k < 2; k++) {
            CHECK(x[k] >= 1000 && x[k] < 1000 + 2 * N && !seen[x[k] - 1000], "fetched %llu twice or out of range",
                  (unsigned long long) x[k]);
            if (x[k] >= 1000 && x[k] < 1000 + 2 * N)
                seen[x[k] - 1000] = 1;
        }
    }
    CHECK(fi_close(&mr->fid) == 0, "fi_close(mr)");
    free(words);
}

/* Two threads at once (FI_THREAD_SAFE's promise, and more than
 * FI_THREAD_DOMAIN's): one sends N tagged messages A -> C, the other
 * receives them on C; each reads its own queue, both drive progress. */
enum { THREAD_N = 300 };
static uint8_t thread_in[THREAD_N][16];

static void *thread_recv(void *arg)
{
    (void) arg;
    struct side *c = &s[2];
    struct fi_cq_tagged_entry e;
    static int ctx[THREAD_N];
    int posted = 0, done = 0;
    for (double end = now_s() + LIMIT_S; done < THREAD_N && now_s() < end;) {
        if (posted < THREAD_N &&
            fi_trecv(c->ep, thread_in[posted], 16, NULL, FI_ADDR_UNSPEC, 0x5000 + (uint64_t) posted, 0,
                     &ctx[posted]) == 0)
            posted++;
        if (fi_cq_read(c->cq, &e, 1) == 1)
            done++;
    }
    return (void *) (intptr_t) done;
}

static void threads(void)
{
    struct side *a = &s[0];
    pthread_t t;
    CHECK(pthread_create(&t, NULL, thread_recv, NULL) == 0, "pthread_create");
    static int ctx[THREAD_N];
    struct fi_cq_tagged_entry e;
    int sent = 0, done = 0;
    for (double end = now_s() + LIMIT_S; done < THREAD_N && now_s() < end;) {
        uint8_t msg[16];
        memset(msg, sent & 0xff, sizeof msg);
        if (sent < THREAD_N && fi_tsend(a->ep, msg, sizeof msg, NULL, a->peer[2], 0x5000 + (uint64_t) sent,
                                        &ctx[sent]) == 0)
            sent++;
        if (fi_cq_read(a->cq, &e, 1) == 1)
            done++;
    }
    void *got;
    pthread_join(t, &got);
    CHECK(done == THREAD_N && (intptr_t) got == THREAD_N, "sent %d, received %d of %d", done, (int) (intptr_t) got,
          THREAD_N);
    for (int i = 0; i < THREAD_N; i++)
        CHECK(thread_in[i][0] == (uint8_t) i && thread_in[i][15] == (uint8_t) i, "message %d", i);
}

int main(int argc, char **argv)
{
    if (argc > 2 || (argc == 2 && strcmp(argv[1], "noatomics")))
        DIE("usage: rdm [noatomics]");
    /* A device without atomics (siw): FI_ATOMIC is not asked for, and
     * fi_query_atomic must refuse everything. */
    int with_atomics = argc == 1;
    struct fi_info *hints = fi_allocinfo(), *info = NULL;
    hints->fabric_attr->prov_name = strdup("xrc");
    hints->caps = FI_MSG | FI_TAGGED | FI_DIRECTED_RECV | FI_SOURCE | FI_RMA | (with_atomics ? FI_ATOMIC : 0);
    hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->ep_attr->type = FI_EP_RDM;
    uint32_t api = fi_version() < FI_VERSION(1, 18) ? fi_version() : FI_VERSION(1, 18);
    int rc = fi_getinfo(api, NULL, NULL, 0, hints, &info);
    if (rc)
        DIE("rdm: fi_getinfo: %s", fi_strerror(-rc));
    struct fid_fabric *fabric;
    if ((rc = fi_fabric(info->fabric_attr, &fabric, NULL)))
        DIE("rdm: fi_fabric: %s", fi_strerror(-rc));
    for (int i = 0; i < 3; i++)
        open_side(fabric, info, &s[i]);
    uint8_t names[3][64];
    for (int i = 0; i < 3; i++) {
        size_t len = sizeof names[i];
        if ((rc = fi_getname(&s[i].ep->fid, names[i], &len)))
            DIE("rdm: fi_getname: %s", fi_strerror(-rc));
    }
    for (int i = 0; i < 3; i++)
        if (fi_av_insert(s[i].av, names, 3, s[i].peer, 0, NULL) != 3)
            DIE("rdm: fi_av_insert");

    size_t sizes[80];
    int n = 0;
    sizes[n++] = 0;
    for (size_t p = 1; p <= (4u << 20); p *= 2) {
        if (p > 1)
            sizes[n++] = p - 1;
        sizes[n++] = p;
        if (p < (4u << 20))
            sizes[n++] = p + 1;
    }
    for (int i = 0; i < n; i++)
        one(&s[0], &s[2], 2, sizes[i], 1, i % 2, (unsigned) i, 0);
    for (int i = 0; i < n; i += 3)
        one(&s[0], &s[1], 1, sizes[i], 0, i % 2, (unsigned) i + 7, 0);
    /* Gathered sends, eager and rendezvous, tagged and not. */
    for (int i = 0; i < n; i += 2)
        one(&s[0], &s[2], 2, sizes[i], i % 4 == 0, i % 3 == 0, (unsigned) i + 11, 1);
    special();
    rma();
    big_region(with_atomics);
    if (with_atomics) {
        atomics();
    } else {
        struct fi_atomic_attr attr;
        CHECK(fi_query_atomic(s[0].domain, FI_UINT64, FI_SUM, &attr, 0) == -FI_EOPNOTSUPP,
              "no atomics on this device, and fi_query_atomic says so");
    }
    threads();

    for (int i = 0; i < 3; i++) {
        if ((rc = fi_close(&s[i].ep->fid)) || (rc = fi_close(&s[i].cq->fid)) || (rc = fi_close(&s[i].av->fid)) ||
            (rc = fi_close(&s[i].domain->fid)))
            DIE("rdm: closing: %s", fi_strerror(-rc));
    }
    if ((rc = fi_close(&fabric->fid)))
        DIE("rdm: fi_close(fabric): %s", fi_strerror(-rc));
    fi_freeinfo(info);
    fi_freeinfo(hints);
    if (failures) {
        fprintf(stderr, "rdm: %d failures\n", failures);
        return 1;
    }
    printf("rdm: passed (%d sizes tagged A->C across nodes, %d untagged A->B on one node, %d gathered from three "
           "pieces, and the special cases)\n",
           n, (n + 2) / 3, (n + 1) / 2);
    return 0;
}
