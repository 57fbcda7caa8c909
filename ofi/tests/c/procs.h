/*
 * What the multi-process C tests (kill.c, pair.c) share: one endpoint per
 * process on the xrc provider, and a meeting through files. Each process
 * writes its endpoint's name into DIR/ROLE.addr (whole, by a rename) and
 * inserts another's once its file is there. Waits follow events (files
 * appearing), bounded by LIMIT_S, the harness's limit, which only a hung
 * run reaches.
 */
#ifndef XRC_OFI_PROCS_H
#define XRC_OFI_PROCS_H

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "check.h"

enum { LIMIT_S = 300, NAME = 64 };

static struct fid_fabric *fabric;
static struct fid_domain *domain;
static struct fid_av *av;
static struct fid_cq *cq;
static struct fid_ep *ep;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double) t.tv_sec + (double) t.tv_nsec / 1e9;
}

/* Opens an FI_EP_RDM endpoint of the xrc provider with `caps` (and the
 * registration modes remote access needs when `caps` has FI_RMA), its
 * address vector and one tagged-format CQ for both directions. */
static void open_all(uint64_t caps)
{
    struct fi_info *hints = fi_allocinfo(), *info = NULL;
    hints->fabric_attr->prov_name = strdup("xrc");
    hints->caps = caps;
    if (caps & FI_RMA)
        hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->ep_attr->type = FI_EP_RDM;
    int rc = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info);
    if (rc)
        DIE("fi_getinfo: %s", fi_strerror(-rc));
    struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
    struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_TAGGED, .size = 64};
    if ((rc = fi_fabric(info->fabric_attr, &fabric, NULL)) || (rc = fi_domain(fabric, info, &domain, NULL)) ||
        (rc = fi_av_open(domain, &av_attr, &av, NULL)) || (rc = fi_cq_open(domain, &cq_attr, &cq, NULL)) ||
        (rc = fi_endpoint(domain, info, &ep, NULL)) || (rc = fi_ep_bind(ep, &av->fid, 0)) ||
        (rc = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV)) || (rc = fi_enable(ep)))
        DIE("opening the endpoint: %s", fi_strerror(-rc));
    fi_freeinfo(info);
    fi_freeinfo(hints);
}

static void close_all(void)
{
    CHECK(fi_close(&ep->fid) == 0, "fi_close(ep)");
    CHECK(fi_close(&cq->fid) == 0, "fi_close(cq)");
    CHECK(fi_close(&av->fid) == 0, "fi_close(av)");
    CHECK(fi_close(&domain->fid) == 0, "fi_close(domain)");
    CHECK(fi_close(&fabric->fid) == 0, "fi_close(fabric)");
}

/* Publishes this endpoint's name as DIR/ROLE.addr. */
static void publish(const char *dir, const char *role)
{
    uint8_t name[NAME];
    size_t len = sizeof name;
    int rc = fi_getname(&ep->fid, name, &len);
    if (rc || len != NAME)
        DIE("fi_getname: %s (%zu bytes)", fi_strerror(-rc), len);
    char tmp[512], path[512];
    snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, role);
    snprintf(path, sizeof path, "%s/%s.addr", dir, role);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(name, 1, NAME, f) != NAME || fclose(f) || rename(tmp, path))
        DIE("writing %s", path);
}

/* Inserts ROLE's name once DIR/ROLE.addr is there. */
static fi_addr_t peer(const char *dir, const char *role)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.addr", dir, role);
    uint8_t name[NAME];
    for (double end = now_s() + LIMIT_S;;) {
        FILE *f = fopen(path, "rb");
        if (f) {
            size_t n = fread(name, 1, NAME, f);
            fclose(f);
            if (n == NAME)
                break;
        }
        if (now_s() > end)
            DIE("no %s within %d s (the harness's limit)", path, LIMIT_S);
        /* Driving progress meanwhile: a peer may already connect. */
        (void) fi_cq_read(cq, NULL, 0);
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    }
    fi_addr_t a = FI_ADDR_NOTAVAIL;
    if (fi_av_insert(av, name, 1, &a, 0, NULL) != 1)
        DIE("fi_av_insert of %s", role);
    return a;
}

#endif
