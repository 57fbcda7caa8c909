/*
 * Bad input to the provider through libfabric's API, on the simulated
 * fabric (scripts/test-ofi): each entry point given NULL where it needs
 * something, an object of the wrong class, flags it does not take, sizes
 * past its limits, or a call in the wrong state gets the error code the
 * man pages name (-FI_EINVAL unless they name another), never a crash,
 * and the objects still work afterwards.
 *
 * (A fid that was closed, or one that is not libfabric's at all, cannot be
 * tested: libfabric's inline calls read its ops table before the provider
 * is reached.)
 */
#define _POSIX_C_SOURCE 200809L
#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <stdint.h>
#include <string.h>

#include "check.h"

int main(void)
{
    struct fi_info *hints = fi_allocinfo(), *info = NULL;
    hints->fabric_attr->prov_name = strdup("xrc");
    hints->caps = FI_MSG | FI_TAGGED | FI_DIRECTED_RECV | FI_RMA | FI_ATOMIC;
    hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    uint32_t api = fi_version() < FI_VERSION(1, 18) ? fi_version() : FI_VERSION(1, 18);
    int rc = fi_getinfo(api, NULL, NULL, 0, hints, &info);
    if (rc)
        DIE("badinput: fi_getinfo: %s", fi_strerror(-rc));

    /* getinfo: a node or service names nothing here. */
    struct fi_info *none = NULL;
    CHECK(fi_getinfo(api, "10.0.0.1", NULL, 0, hints, &none) == -FI_ENODATA, "a node");
    CHECK(fi_getinfo(api, NULL, "4791", 0, hints, &none) == -FI_ENODATA, "a service");

    struct fid_fabric *fabric;
    if ((rc = fi_fabric(info->fabric_attr, &fabric, NULL)))
        DIE("badinput: fi_fabric: %s", fi_strerror(-rc));
    struct fid_domain *domain = NULL;
    CHECK(fi_domain(fabric, NULL, &domain, NULL) == -FI_EINVAL, "a domain of no info");
    CHECK(fi_domain2(fabric, info, &domain, 1, NULL) == -FI_EBADFLAGS, "a domain with flags");
    if ((rc = fi_domain(fabric, info, &domain, NULL)))
        DIE("badinput: fi_domain: %s", fi_strerror(-rc));

    /* Address vectors, queues, counters. */
    struct fid_av *av = NULL;
    struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
    CHECK(fi_av_open(domain, NULL, &av, NULL) == -FI_EINVAL, "an AV of no attributes");
    struct fi_av_attr named = {.type = FI_AV_TABLE, .name = "shared"};
    CHECK(fi_av_open(domain, &named, &av, NULL) == -FI_ENOSYS, "a named (shared) AV");
    struct fi_av_attr bits = {.type = FI_AV_TABLE, .rx_ctx_bits = 4};
    CHECK(fi_av_open(domain, &bits, &av, NULL) == -FI_EINVAL, "receive context bits");
    struct fi_av_attr async = {.type = FI_AV_TABLE, .flags = FI_EVENT};
    CHECK(fi_av_open(domain, &async, &av, NULL) == -FI_ENOSYS, "asynchronous insertion");
    if (fi_av_open(domain, &av_attr, &av, NULL))
        DIE("badinput: fi_av_open");
    fi_addr_t fa[2];
    size_t len = 0;
    CHECK(fi_av_remove(av, NULL, 1, 0) == -FI_EINVAL, "remove of no array");
    CHECK(fi_av_remove(av, fa, 1, 7) == -FI_EBADFLAGS, "remove with flags");
    CHECK(fi_av_lookup(av, 0, NULL, NULL) == -FI_EINVAL, "lookup of no length");
    CHECK(fi_av_lookup(av, 12345, NULL, &len) == -FI_EINVAL, "lookup of nothing");
    CHECK(fi_av_insert(av, NULL, 0, fa, 0, NULL) == 0, "inserting nothing");
    CHECK(fi_av_insert(av, "x", 1, fa, FI_SYNC_ERR, NULL) == -FI_EINVAL, "FI_SYNC_ERR with no error array");
    CHECK(fi_av_insertsvc(av, "node", "svc", fa, 0, NULL) == -FI_ENOSYS, "a service name");

    struct fid_cq *cq = NULL;
    struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_TAGGED};
    CHECK(fi_cq_open(domain, NULL, &cq, NULL) == -FI_EINVAL, "a CQ of no attributes");
    struct fi_cq_attr cq_flags = {.format = FI_CQ_FORMAT_TAGGED, .flags = 1};
    CHECK(fi_cq_open(domain, &cq_flags, &cq, NULL) == -FI_EBADFLAGS, "a CQ with flags");
    struct fi_cq_attr cond = {.format = FI_CQ_FORMAT_TAGGED, .wait_cond = FI_CQ_COND_THRESHOLD};
    CHECK(fi_cq_open(domain, &cond, &cq, NULL) == -FI_ENOSYS, "a wait condition");
    if (fi_cq_open(domain, &cq_attr, &cq, NULL))
        DIE("badinput: fi_cq_open");
    CHECK(fi_cq_read(cq, NULL, 1) == -FI_EINVAL, "a read into nothing");
    CHECK(fi_cq_readerr(cq, NULL, 0) == -FI_EINVAL, "readerr into nothing");
    struct fid_cntr *cntr = NULL;
    struct fi_cntr_attr cntr_flags = {.flags = 1};
    CHECK(fi_cntr_open(domain, &cntr_flags, &cntr, NULL) == -FI_EBADFLAGS, "a counter with flags");

    /* Registrations. */
    static uint8_t mem[8192];
    struct fid_mr *mr = NULL;
    CHECK(fi_mr_reg(domain, NULL, 64, FI_REMOTE_READ, 0, 0, 0, &mr, NULL) == -FI_EINVAL, "no buffer");
    CHECK(fi_mr_reg(domain, mem, 0, FI_REMOTE_READ, 0, 0, 0, &mr, NULL) == -FI_EINVAL, "no length");
    CHECK(fi_mr_reg(domain, mem, 64, 1ULL << 40, 0, 0, 0, &mr, NULL) == -FI_EBADFLAGS, "unknown access bits");
    CHECK(fi_mr_reg(domain, mem, 64, FI_REMOTE_READ, 0, 0, 1, &mr, NULL) == -FI_EBADFLAGS, "flags");
    struct iovec two[2] = {{mem, 64}, {mem + 64, 64}};
    CHECK(fi_mr_regv(domain, two, 2, FI_REMOTE_READ, 0, 0, 0, &mr, NULL) == -FI_EINVAL, "two pieces");

    /* Endpoints: binding and state. */
    struct fid_ep *ep = NULL;
    CHECK(fi_endpoint(domain, NULL, &ep, NULL) == -FI_EINVAL, "an endpoint of no info");
    CHECK(fi_endpoint2(domain, info, &ep, 1, NULL) == -FI_EBADFLAGS, "an endpoint with flags");
    if (fi_endpoint(domain, info, &ep, NULL))
        DIE("badinput: fi_endpoint");
    CHECK(fi_ep_bind(ep, NULL, 0) == -FI_EINVAL, "binding nothing");
    CHECK(fi_ep_bind(ep, &fabric->fid, 0) == -FI_EINVAL, "binding a fabric");
    CHECK(fi_ep_bind(ep, &ep->fid, 0) == -FI_EINVAL, "binding an endpoint to itself");
    CHECK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | (1ULL << 40)) == -FI_EBADFLAGS, "unknown bind flags");
    uint8_t buf[64] = {0};
    CHECK(fi_send(ep, buf, 8, NULL, 0, NULL) == -FI_EOPBADSTATE, "a send before fi_enable");
    CHECK(fi_recv(ep, buf, 8, NULL, FI_ADDR_UNSPEC, NULL) == -FI_EOPBADSTATE, "a receive before fi_enable");
    CHECK(fi_control(&ep->fid, FI_GETWAIT, NULL) == -FI_ENOSYS, "an unknown command");
    CHECK(fi_getname(&ep->fid, buf, NULL) == -FI_EINVAL, "getname with no length");
    CHECK(fi_getopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, NULL, NULL) == -FI_EINVAL, "getopt into nothing");
    size_t v = 0, vlen = 1;
    CHECK(fi_getopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &v, &vlen) == -FI_ETOOSMALL &&
              vlen == sizeof(size_t),
          "getopt into too little");
    CHECK(fi_setopt(&ep->fid, 99, FI_OPT_MIN_MULTI_RECV, &v, sizeof v) == -FI_ENOPROTOOPT, "an unknown level");
    if (fi_ep_bind(ep, &av->fid, 0) || fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV) || fi_enable(ep))
        DIE("badinput: binding");
    uint8_t name[64];
    len = sizeof name;
    if (fi_getname(&ep->fid, name, &len) || fi_av_insert(av, name, 1, fa, 0, NULL) != 1)
        DIE("badinput: own address");

    /* Data transfer. */
    CHECK(fi_send(ep, NULL, 8, NULL, fa[0], NULL) == -FI_EINVAL, "a send of no buffer");
    CHECK(fi_recv(ep, NULL, 8, NULL, FI_ADDR_UNSPEC, NULL) == -FI_EINVAL, "a receive into no buffer");
    CHECK(fi_send(ep, buf, 8, NULL, 999, NULL) == -FI_EINVAL, "a send to an address not in the vector");
    CHECK(fi_recv(ep, buf, 8, NULL, 999, NULL) == -FI_EINVAL, "a receive from one");
    struct iovec iov2[2] = {{buf, 8}, {buf + 8, 8}};
    struct iovec iov9[9];
    for (int i = 0; i < 9; i++)
        iov9[i] = (struct iovec){buf, 1};
    CHECK(fi_sendv(ep, iov9, NULL, 9, fa[0], NULL) == -FI_EINVAL, "nine pieces to send (iov_limit 8)");
    struct iovec hole[2] = {{buf, 8}, {NULL, 8}};
    CHECK(fi_sendv(ep, hole, NULL, 2, fa[0], NULL) == -FI_EINVAL, "a piece with no buffer");
    CHECK(fi_recvv(ep, iov2, NULL, 2, FI_ADDR_UNSPEC, NULL) == -FI_EINVAL, "two pieces to receive");
    CHECK(fi_sendmsg(ep, NULL, 0) == -FI_EINVAL, "no message");
    static uint8_t big[8192];
    CHECK(fi_inject(ep, big, sizeof big, fa[0]) == -FI_EINVAL, "an inject past inject_size");
    struct iovec one = {buf, 8};
    struct fi_msg_tagged tm = {.msg_iov = &one, .iov_count = 1, .addr = FI_ADDR_UNSPEC};
    struct fi_msg m = {.msg_iov = &one, .iov_count = 1, .addr = FI_ADDR_UNSPEC};
    CHECK(fi_recvmsg(ep, &m, FI_PEEK) == -FI_EINVAL, "a peek in the untagged space");
    CHECK(fi_trecvmsg(ep, &tm, FI_MULTI_RECV) == -FI_EINVAL, "a tagged multi-receive");
    CHECK(fi_trecvmsg(ep, &tm, FI_DISCARD) == -FI_EINVAL, "a discard without peek or claim");
    int ctx;
    tm.context = &ctx;
    CHECK(fi_trecvmsg(ep, &tm, FI_CLAIM) == -FI_EINVAL, "a claim of nothing claimed");
    CHECK(fi_write(ep, buf, 8, NULL, fa[0], (uint64_t) (uintptr_t) mem, 1ULL << 40, NULL) == -FI_EINVAL,
          "a key no registration gives");
    CHECK(fi_read(ep, NULL, 8, NULL, fa[0], 0, 0, NULL) == -FI_EINVAL, "a read into nothing");
    uint64_t x = 1, res;
    CHECK(fi_atomic(ep, &x, 1, NULL, fa[0], 4, 0, FI_UINT64, FI_SUM, NULL) == -FI_EINVAL, "a misaligned atomic");
    CHECK(fi_atomic(ep, NULL, 1, NULL, fa[0], 8, 0, FI_UINT64, FI_SUM, NULL) == -FI_EINVAL, "an atomic of nothing");
    CHECK(fi_fetch_atomic(ep, &x, 1, NULL, NULL, NULL, fa[0], 8, 0, FI_UINT64, FI_SUM, NULL) == -FI_EINVAL,
          "a fetch into nothing");
    CHECK(fi_compare_atomic(ep, &x, 1, NULL, NULL, NULL, &res, NULL, fa[0], 8, 0, FI_UINT64, FI_CSWAP, NULL) ==
              -FI_EINVAL,
          "a compare of nothing");
    CHECK(fi_atomic(ep, &x, 1, NULL, fa[0], 8, 0, FI_DOUBLE, FI_SUM, NULL) == -FI_EOPNOTSUPP, "a double sum");

    /* Everything still works: a message to itself. */
    uint8_t in[8] = {0};
    struct fi_cq_tagged_entry e[2];
    CHECK(fi_trecv(ep, in, sizeof in, NULL, FI_ADDR_UNSPEC, 1, 0, &ctx) == 0, "trecv");
    CHECK(fi_tsend(ep, "working", 8, NULL, fa[0], 1, &ctx) == 0, "tsend to itself");
    int got = 0;
    for (long i = 0; i < 1000000 && got < 2; i++) {
        ssize_t n = fi_cq_read(cq, e, 2);
        if (n > 0)
            got += (int) n;
    }
    CHECK(got == 2 && !memcmp(in, "working", 8), "a message after all that: %d completions", got);

    /* Closing in the wrong order is refused; in the right one, done. */
    CHECK(fi_close(&av->fid) == -FI_EBUSY && fi_close(&cq->fid) == -FI_EBUSY, "bound objects stay");
    CHECK(fi_close(&domain->fid) == -FI_EBUSY && fi_close(&fabric->fid) == -FI_EBUSY, "parents stay");
    CHECK(fi_close(&ep->fid) == 0 && fi_close(&av->fid) == 0 && fi_close(&cq->fid) == 0, "children close");
    CHECK(fi_close(&domain->fid) == 0 && fi_close(&fabric->fid) == 0, "then their parents");
    fi_freeinfo(info);
    fi_freeinfo(hints);
    if (failures) {
        fprintf(stderr, "badinput: %d failures\n", failures);
        return 1;
    }
    printf("badinput: passed\n");
    return 0;
}
