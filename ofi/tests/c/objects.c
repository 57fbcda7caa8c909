/*
 * The provider's domain, address vectors, completion queues and counters
 * through libfabric's API, on the simulated fabric (XRCBTL_OFI_FABRIC=sim;
 * scripts/test-ofi): domains take the simulated job's ranks until none is
 * left; address vectors of both types take well-formed addresses, fail
 * malformed ones entry by entry, look them up, print them, remove them;
 * event queues hold what the application writes into them;
 * completion queues open in every format and read empty, wait and are
 * signalled; counters count; endpoints give their addresses, bind to their
 * domain's objects and enable once bound; bad flags, formats, options and
 * closing in the wrong order get the codes the man pages name.
 *
 * Some addresses are built here by hand, in the layout ofi/src/addr.rs
 * documents (64 bytes: 'X', version 1, flags, 0, rank, endpoint, port,
 * IP), to stand for peers that are not in this process.
 *
 *   objects          (4 simulated ranks: XRCBTL_OFI_SIM_NODES=2 and
 *                     XRCBTL_OFI_SIM_RANKS_PER_NODE=2, the defaults)
 */
#define _POSIX_C_SOURCE 200809L
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define ADDR_LEN 64

static void make_addr(uint8_t *a, uint32_t rank, uint16_t ep, uint16_t port, const uint8_t ip[4])
{
    memset(a, 0, ADDR_LEN);
    a[0] = 'X';
    a[1] = 1;
    memcpy(a + 4, &rank, 4);
    memcpy(a + 8, &ep, 2);
    memcpy(a + 10, &port, 2);
    memcpy(a + 12, ip, 4);
}

static const uint8_t ip1[4] = {10, 0, 0, 1}, ip2[4] = {10, 0, 1, 1};

static void av_table(struct fid_domain *domain)
{
    struct fi_av_attr attr = {.type = FI_AV_TABLE};
    struct fid_av *av = NULL;
    int rc = fi_av_open(domain, &attr, &av, NULL);
    CHECK(rc == 0, "fi_av_open(table): %s", fi_strerror(-rc));
    if (rc) {
        return;
    }
    uint8_t addrs[3 * ADDR_LEN];
    make_addr(addrs, 0, 0, 4791, ip1);
    make_addr(addrs + ADDR_LEN, 1, 0, 4791, ip1);
    addrs[ADDR_LEN] = 'Y'; /* not ours */
    make_addr(addrs + 2 * ADDR_LEN, 2, 3, 4792, ip2);
    fi_addr_t fa[3] = {0, 0, 0};
    int errors[3] = {1, 1, 1};
    rc = fi_av_insert(av, addrs, 3, fa, FI_SYNC_ERR, errors);
    CHECK(rc == 2, "inserted %d of 3 (one malformed)", rc);
    CHECK(fa[0] == 0 && fa[1] == FI_ADDR_NOTAVAIL && fa[2] == 1, "fi_addr %llu %llu %llu",
          (unsigned long long) fa[0], (unsigned long long) fa[1], (unsigned long long) fa[2]);
    CHECK(errors[0] == 0 && errors[1] == -FI_EINVAL && errors[2] == 0, "errors %d %d %d", errors[0], errors[1],
          errors[2]);

    uint8_t back[ADDR_LEN];
    size_t len = sizeof back;
    rc = fi_av_lookup(av, fa[2], back, &len);
    CHECK(rc == 0 && len == ADDR_LEN && !memcmp(back, addrs + 2 * ADDR_LEN, ADDR_LEN), "lookup: %d, len %zu", rc,
          len);
    uint8_t small[8];
    len = sizeof small;
    rc = fi_av_lookup(av, fa[0], small, &len);
    CHECK(rc == 0 && len == ADDR_LEN && !memcmp(small, addrs, sizeof small), "truncated lookup: %d, len %zu", rc,
          len);

    char text[64];
    len = sizeof text;
    const char *s = fi_av_straddr(av, addrs + 2 * ADDR_LEN, text, &len);
    CHECK(s == text && !strcmp(text, "xrc://10.0.1.1:4792/2.3") && len == strlen(text) + 1, "straddr: %s (%zu)",
          s ? s : "(null)", len);
    char tiny[6];
    len = sizeof tiny;
    s = fi_av_straddr(av, addrs, tiny, &len);
    CHECK(s == tiny && !strcmp(tiny, "xrc:/") && len == strlen("xrc://10.0.0.1:4791/0.0") + 1,
          "cut straddr: %s (%zu)", tiny, len);

    /* Rank 2's endpoint 3 again, at another listener: refused. */
    uint8_t moved[ADDR_LEN];
    make_addr(moved, 2, 3, 4999, ip2);
    int code = 1;
    fi_addr_t none = 0;
    rc = fi_av_insert(av, moved, 1, &none, FI_SYNC_ERR, &code);
    CHECK(rc == 0 && none == FI_ADDR_NOTAVAIL && code == -FI_EADDRINUSE, "a second address for one endpoint: %d, %d",
          rc, code);

    rc = fi_av_insert(av, addrs, 1, fa, FI_AV_USER_ID, NULL);
    CHECK(rc == -FI_EBADFLAGS, "FI_AV_USER_ID: %d", rc);
    rc = fi_av_insert(av, NULL, 1, fa, 0, NULL);
    CHECK(rc == -FI_EINVAL, "NULL addresses: %d", rc);

    rc = fi_av_remove(av, &fa[0], 1, 0);
    CHECK(rc == 0, "remove: %s", fi_strerror(-rc));
    len = sizeof back;
    rc = fi_av_lookup(av, fa[0], back, &len);
    CHECK(rc == -FI_EINVAL, "lookup of a removed entry: %d", rc);
    rc = fi_av_remove(av, &fa[0], 1, 0);
    CHECK(rc == -FI_EINVAL, "second remove: %d", rc);
    /* A table hands out the next index; the removed one stays unused. */
    rc = fi_av_insert(av, addrs, 1, fa, 0, NULL);
    CHECK(rc == 1 && fa[0] == 2, "reinsert: %d, index %llu", rc, (unsigned long long) fa[0]);

    rc = fi_close(&domain->fid);
    CHECK(rc == -FI_EBUSY, "closing a domain with an AV open: %d", rc);
    rc = fi_close(&av->fid);
    CHECK(rc == 0, "fi_close(av): %s", fi_strerror(-rc));
}

static void av_map(struct fid_domain *domain)
{
    struct fi_av_attr attr = {.type = FI_AV_MAP};
    struct fid_av *av = NULL;
    int rc = fi_av_open(domain, &attr, &av, NULL);
    CHECK(rc == 0, "fi_av_open(map): %s", fi_strerror(-rc));
    if (rc) {
        return;
    }
    uint8_t a[ADDR_LEN];
    make_addr(a, 3, 1, 4791, ip2);
    fi_addr_t x = 0, y = 0, z = 0;
    CHECK(fi_av_insert(av, a, 1, &x, 0, NULL) == 1, "insert");
    CHECK(fi_av_insert(av, a, 1, &y, 0, NULL) == 1, "insert again");
    CHECK(x != y && x != FI_ADDR_NOTAVAIL && y != FI_ADDR_NOTAVAIL, "two numbers for two entries");
    CHECK(fi_av_remove(&*av, &x, 1, 0) == 0, "remove");
    CHECK(fi_av_insert(av, a, 1, &z, 0, NULL) == 1, "insert a third time");
    CHECK(z != x, "a removed number is not handed out again at once (%llu)", (unsigned long long) z);
    uint8_t back[ADDR_LEN];
    size_t len = sizeof back;
    CHECK(fi_av_lookup(av, x, back, &len) == -FI_EINVAL, "a stale number finds nothing");
    len = sizeof back;
    CHECK(fi_av_lookup(av, y, back, &len) == 0 && !memcmp(back, a, ADDR_LEN), "the other still does");
    CHECK(fi_close(&av->fid) == 0, "fi_close(av)");
}

static void cq(struct fid_domain *domain)
{
    const enum fi_cq_format formats[] = {FI_CQ_FORMAT_UNSPEC, FI_CQ_FORMAT_CONTEXT, FI_CQ_FORMAT_MSG,
                                         FI_CQ_FORMAT_DATA, FI_CQ_FORMAT_TAGGED};
    for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) {
        struct fi_cq_attr attr = {.format = formats[f], .size = 16};
        struct fid_cq *q = NULL;
        int rc = fi_cq_open(domain, &attr, &q, NULL);
        CHECK(rc == 0, "fi_cq_open(format %d): %s", (int) formats[f], fi_strerror(-rc));
        if (rc) {
            continue;
        }
        struct fi_cq_tagged_entry e[4];
        fi_addr_t src[4];
        struct fi_cq_err_entry ee = {0};
        CHECK(fi_cq_read(q, e, 4) == -FI_EAGAIN, "an empty queue reads nothing");
        CHECK(fi_cq_readfrom(q, e, 4, src) == -FI_EAGAIN, "nor from anyone");
        CHECK(fi_cq_readerr(q, &ee, 0) == -FI_EAGAIN, "and has no error");
        CHECK(fi_cq_readerr(q, &ee, 1) == -FI_EBADFLAGS, "readerr takes no flags");
        CHECK(fi_cq_sread(q, e, 4, NULL, 10) == -FI_EAGAIN, "a wait of 10 ms finds nothing");
        CHECK(fi_cq_signal(q) == 0, "signal");
        CHECK(fi_cq_sread(q, e, 4, NULL, -1) == -FI_EAGAIN, "a signalled wait returns");
        CHECK(fi_close(&q->fid) == 0, "fi_close(cq)");
    }
    struct fi_cq_attr bad = {.format = (enum fi_cq_format) 99};
    struct fid_cq *q = NULL;
    CHECK(fi_cq_open(domain, &bad, &q, NULL) == -FI_ENOSYS, "an unknown format");
    struct fi_cq_attr fd = {.wait_obj = FI_WAIT_FD};
    CHECK(fi_cq_open(domain, &fd, &q, NULL) == -FI_ENOSYS, "a file descriptor to wait on");

    struct fi_cq_attr attr = {.format = FI_CQ_FORMAT_CONTEXT};
    if (fi_cq_open(domain, &attr, &q, NULL) == 0) {
        char buf[16];
        const char *t = fi_cq_strerror(q, 1, NULL, NULL, 0);
        CHECK(t && strstr(t, "peer failed"), "strerror: %s", t ? t : "(null)");
        t = fi_cq_strerror(q, 1, NULL, buf, sizeof buf);
        CHECK(t == buf && strlen(buf) == sizeof buf - 1 && !strncmp(buf, "xrc: the peer f", 15), "cut: %s", buf);
        CHECK(fi_close(&domain->fid) == -FI_EBUSY, "closing a domain with a queue open");
        CHECK(fi_close(&q->fid) == 0, "fi_close(cq)");
    }
}

static void cntr(struct fid_domain *domain)
{
    struct fid_cntr *c = NULL;
    int rc = fi_cntr_open(domain, NULL, &c, NULL);
    CHECK(rc == 0, "fi_cntr_open: %s", fi_strerror(-rc));
    if (rc) {
        return;
    }
    CHECK(fi_cntr_read(c) == 0 && fi_cntr_readerr(c) == 0, "a new counter is zero");
    CHECK(fi_cntr_add(c, 5) == 0 && fi_cntr_read(c) == 5, "add");
    CHECK(fi_cntr_set(c, 2) == 0 && fi_cntr_read(c) == 2, "set");
    CHECK(fi_cntr_adderr(c, 3) == 0 && fi_cntr_readerr(c) == 3, "adderr");
    CHECK(fi_cntr_seterr(c, 1) == 0 && fi_cntr_readerr(c) == 1, "seterr");
    CHECK(fi_cntr_wait(c, 2, 0) == 0, "a reached threshold");
    CHECK(fi_cntr_wait(c, 3, 10) == -FI_ETIMEDOUT, "an unreached one times out");
    CHECK(fi_close(&c->fid) == 0, "fi_close(cntr)");
    struct fi_cntr_attr fd = {.events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_FD};
    CHECK(fi_cntr_open(domain, &fd, &c, NULL) == -FI_ENOSYS, "a file descriptor to wait on");
}

static void endpoint(struct fid_domain *domain, struct fid_domain *other, struct fi_info *info, uint32_t rank)
{
    struct fid_ep *ep = NULL, *ep2 = NULL;
    int rc = fi_endpoint(domain, info, &ep, NULL);
    CHECK(rc == 0, "fi_endpoint: %s", fi_strerror(-rc));
    if (rc) {
        return;
    }
    CHECK(fi_endpoint(domain, info, &ep2, NULL) == 0, "a second endpoint");

    uint8_t name[ADDR_LEN + 8], small[8];
    size_t len = sizeof name;
    rc = fi_getname(&ep->fid, name, &len);
    CHECK(rc == 0 && len == ADDR_LEN, "getname: %d, len %zu", rc, len);
    uint32_t r;
    uint16_t n;
    memcpy(&r, name + 4, 4);
    memcpy(&n, name + 8, 2);
    CHECK(name[0] == 'X' && name[1] == 1 && r == rank && n == 0, "the first endpoint of rank %u: rank %u, ep %u",
          rank, r, n);
    uint8_t name2[ADDR_LEN];
    len = sizeof name2;
    if (ep2 && fi_getname(&ep2->fid, name2, &len) == 0) {
        memcpy(&n, name2 + 8, 2);
        CHECK(n == 1 && !memcmp(name, name2, 8) && !memcmp(name + 10, name2 + 10, ADDR_LEN - 10),
              "the second endpoint differs in its number alone (%u)", n);
    }
    len = sizeof small;
    rc = fi_getname(&ep->fid, small, &len);
    CHECK(rc == -FI_ETOOSMALL && len == ADDR_LEN && !memcmp(small, name, sizeof small), "a small buffer: %d, %zu",
          rc, len);
    len = 0;
    CHECK(fi_getname(&ep->fid, NULL, &len) == -FI_ETOOSMALL && len == ADDR_LEN, "the length alone");

    struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
    struct fid_av *av = NULL, *av2 = NULL, *foreign_av = NULL;
    struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_TAGGED};
    struct fid_cq *cq = NULL, *foreign_cq = NULL;
    struct fid_cntr *cntr = NULL;
    CHECK(fi_av_open(domain, &av_attr, &av, NULL) == 0 && fi_av_open(domain, &av_attr, &av2, NULL) == 0 &&
              fi_av_open(other, &av_attr, &foreign_av, NULL) == 0,
          "AVs");
    CHECK(fi_cq_open(domain, &cq_attr, &cq, NULL) == 0 && fi_cq_open(other, &cq_attr, &foreign_cq, NULL) == 0,
          "CQs");
    CHECK(fi_cntr_open(domain, NULL, &cntr, NULL) == 0, "a counter");
    if (!av || !av2 || !foreign_av || !cq || !foreign_cq || !cntr) {
        return;
    }
    /* The endpoint's own address goes into a vector and comes back. */
    fi_addr_t me;
    uint8_t back[ADDR_LEN];
    len = sizeof back;
    CHECK(fi_av_insert(av, name, 1, &me, 0, NULL) == 1 && fi_av_lookup(av, me, back, &len) == 0 &&
              !memcmp(back, name, ADDR_LEN),
          "its address in a vector");

    CHECK(fi_enable(ep) == -FI_ENOAV, "enabled without an AV");
    CHECK(fi_ep_bind(ep, &foreign_av->fid, 0) == -FI_EINVAL, "another domain's AV");
    CHECK(fi_ep_bind(ep, &av->fid, 1) == -FI_EBADFLAGS, "an AV with flags");
    CHECK(fi_ep_bind(ep, &av->fid, 0) == 0, "bind the AV");
    CHECK(fi_ep_bind(ep, &av2->fid, 0) == -FI_EINVAL, "a second AV");
    CHECK(fi_enable(ep) == -FI_ENOCQ, "enabled without CQs");
    CHECK(fi_ep_bind(ep, &cq->fid, FI_RECV | FI_REMOTE_WRITE) == -FI_EBADFLAGS, "a CQ with a counter's flag");
    CHECK(fi_ep_bind(ep, &cq->fid, 0) == -FI_EINVAL, "a CQ for nothing");
    CHECK(fi_ep_bind(ep, &foreign_cq->fid, FI_TRANSMIT) == -FI_EINVAL, "another domain's CQ");
    CHECK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV) == 0, "bind the CQ");
    CHECK(fi_ep_bind(ep, &cq->fid, FI_RECV) == -FI_EINVAL, "a second receive CQ");
    CHECK(fi_ep_bind(ep, &cntr->fid, 0) == -FI_EBADFLAGS, "a counter for nothing");
    CHECK(fi_ep_bind(ep, &cntr->fid, FI_SEND | FI_RECV | FI_REMOTE_WRITE) == 0, "bind the counter");
    CHECK(fi_ep_bind(ep, &domain->fid, 0) == -FI_EINVAL, "a domain is nothing to bind");
    CHECK(fi_enable(ep) == 0, "enable");
    CHECK(fi_ep_bind(ep, &av2->fid, 0) == -FI_EOPBADSTATE, "a bind after enabling");

    size_t v = 1, vlen = sizeof v;
    CHECK(fi_getopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &v, &vlen) == 0 && v == 0, "default %zu", v);
    v = 4096;
    CHECK(fi_setopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &v, sizeof v) == 0, "setopt");
    v = 0;
    CHECK(fi_getopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &v, &vlen) == 0 && v == 4096, "now %zu", v);
    CHECK(fi_getopt(&ep->fid, FI_OPT_ENDPOINT, 77, &v, &vlen) == -FI_ENOPROTOOPT, "an unknown option");
    CHECK(fi_setopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &v, 2) == -FI_EINVAL, "a short option");
    int ctx;
    CHECK(fi_cancel(&ep->fid, &ctx) == -FI_ENOENT, "nothing to cancel");

    CHECK(fi_close(&av->fid) == -FI_EBUSY, "closing a bound AV");
    CHECK(fi_close(&cq->fid) == -FI_EBUSY, "closing a bound CQ");
    CHECK(fi_close(&cntr->fid) == -FI_EBUSY, "closing a bound counter");
    CHECK(fi_close(&domain->fid) == -FI_EBUSY, "closing a domain with endpoints");
    CHECK(fi_close(&ep->fid) == 0, "fi_close(ep)");
    if (ep2) {
        CHECK(fi_close(&ep2->fid) == 0, "fi_close(ep2)");
    }
    /* Its number is free again. */
    if (fi_endpoint(domain, info, &ep, NULL) == 0) {
        len = sizeof name2;
        CHECK(fi_getname(&ep->fid, name2, &len) == 0 && !memcmp(name2, name, ADDR_LEN), "number 0 again");
        fi_close(&ep->fid);
    }
    CHECK(fi_close(&av->fid) == 0 && fi_close(&av2->fid) == 0 && fi_close(&foreign_av->fid) == 0, "close AVs");
    CHECK(fi_close(&cq->fid) == 0 && fi_close(&foreign_cq->fid) == 0 && fi_close(&cntr->fid) == 0, "close the rest");
}

/* An event queue: the provider reports nothing through one, so it holds
 * what the application writes, in order; FI_PEEK leaves an event in
 * place; reads of an empty queue, and waits that time out, say EAGAIN; a
 * buffer too small is refused and the event stays; the fabric cannot
 * close under it. */
static void eq(struct fid_fabric *fabric)
{
    struct fi_eq_attr attr = {.wait_obj = FI_WAIT_UNSPEC};
    struct fid_eq *q = NULL;
    int rc = fi_eq_open(fabric, &attr, &q, NULL);
    CHECK(rc == 0, "fi_eq_open: %s", fi_strerror(-rc));
    if (rc)
        return;
    struct fi_eq_attr fd = {.wait_obj = FI_WAIT_FD};
    struct fid_eq *q2 = NULL;
    CHECK(fi_eq_open(fabric, &fd, &q2, NULL) == -FI_ENOSYS, "an fd wait object");
    uint32_t event = 0;
    uint64_t buf[4] = {0};
    CHECK(fi_eq_read(q, &event, buf, sizeof buf, 0) == -FI_EAGAIN, "an empty queue reads EAGAIN");
    CHECK(fi_eq_sread(q, &event, buf, sizeof buf, 10, 0) == -FI_EAGAIN, "a wait on an empty queue times out");
    struct fi_eq_err_entry ee;
    CHECK(fi_eq_readerr(q, &ee, 0) == -FI_EAGAIN, "no error entries");
    uint64_t one[2] = {11, 12}, two[1] = {21};
    CHECK(fi_eq_write(q, FI_NOTIFY, one, sizeof one, 0) == (ssize_t) sizeof one, "fi_eq_write");
    CHECK(fi_eq_write(q, FI_MR_COMPLETE, two, sizeof two, 0) == (ssize_t) sizeof two, "fi_eq_write");
    CHECK(fi_eq_read(q, &event, buf, 8, 0) == -FI_ETOOSMALL, "a buffer too small");
    CHECK(fi_eq_read(q, &event, buf, sizeof buf, FI_PEEK) == (ssize_t) sizeof one && event == FI_NOTIFY,
          "a peek");
    CHECK(fi_eq_sread(q, &event, buf, sizeof buf, -1, 0) == (ssize_t) sizeof one && event == FI_NOTIFY &&
              buf[0] == 11 && buf[1] == 12,
          "the first event, once");
    CHECK(fi_eq_read(q, &event, buf, sizeof buf, 0) == (ssize_t) sizeof two && event == FI_MR_COMPLETE &&
              buf[0] == 21,
          "the second");
    CHECK(fi_eq_read(q, &event, buf, sizeof buf, 0) == -FI_EAGAIN, "then none");
    CHECK(fi_close(&fabric->fid) == -FI_EBUSY, "closing a fabric with an event queue open");
    CHECK(fi_close(&q->fid) == 0, "fi_close(eq)");
}

int main(void)
{
    struct fi_info *hints = fi_allocinfo(), *info = NULL;
    hints->fabric_attr->prov_name = strdup("xrc");
    uint32_t api = fi_version() < FI_VERSION(1, 18) ? fi_version() : FI_VERSION(1, 18);
    int rc = fi_getinfo(api, NULL, NULL, 0, hints, &info);
    if (rc) {
        fprintf(stderr, "objects: fi_getinfo: %s\n", fi_strerror(-rc));
        return 1;
    }
    struct fid_fabric *fabric = NULL;
    rc = fi_fabric(info->fabric_attr, &fabric, NULL);
    CHECK(rc == 0, "fi_fabric: %s", fi_strerror(-rc));
    if (rc) {
        return 1;
    }

    eq(fabric);

    /* Four simulated ranks: four domains, then none. */
    struct fid_domain *d[5] = {NULL};
    for (int i = 0; i < 4; i++) {
        rc = fi_domain(fabric, info, &d[i], NULL);
        CHECK(rc == 0, "domain %d: %s", i, fi_strerror(-rc));
    }
    rc = fi_domain(fabric, info, &d[4], NULL);
    CHECK(rc == -FI_ENOSPC, "a fifth domain: %d", rc);
    rc = fi_close(&fabric->fid);
    CHECK(rc == -FI_EBUSY, "closing a fabric with domains open: %d", rc);

    if (d[0]) {
        av_table(d[0]);
        av_map(d[0]);
        cq(d[1]);
        cntr(d[1]);
        if (d[2] && d[3]) {
            endpoint(d[2], d[3], info, 2);
        }
    }
    for (int i = 0; i < 4; i++) {
        if (d[i]) {
            rc = fi_close(&d[i]->fid);
            CHECK(rc == 0, "fi_close(domain %d): %s", i, fi_strerror(-rc));
        }
    }
    /* Every rank given back: a domain opens again. */
    rc = fi_domain(fabric, info, &d[0], NULL);
    CHECK(rc == 0, "a domain after all closed: %s", fi_strerror(-rc));
    if (!rc) {
        CHECK(fi_close(&d[0]->fid) == 0, "fi_close(domain)");
    }
    rc = fi_close(&fabric->fid);
    CHECK(rc == 0, "fi_close(fabric): %s", fi_strerror(-rc));
    fi_freeinfo(info);
    fi_freeinfo(hints);
    if (failures) {
        fprintf(stderr, "objects: %d failures\n", failures);
        return 1;
    }
    printf("objects: passed\n");
    return 0;
}
