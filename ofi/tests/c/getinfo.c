/*
 * The provider's getinfo and fabric through libfabric's own API, as an MPI
 * reaches them: with FI_PROVIDER_PATH naming the directory of libxrc-fi.so
 * (scripts/test-ofi). Each MPI's hints (ofi-provider research note) get an
 * answer shaped as that MPI needs it; hints asking what the provider cannot
 * do get -FI_ENODATA; answers survive fi_dupinfo and fi_freeinfo (the run
 * is under valgrind); the fabric opens and closes.
 *
 *   getinfo DOMAIN [noatomics]
 *       DOMAIN: the device the provider must offer (sim0 with
 *       XRCBTL_OFI_FABRIC=sim, rxe0, siw0); noatomics: it has no atomics
 *       (siw), so FI_ATOMIC must not be offered on it
 */
#define _POSIX_C_SOURCE 200809L
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static const char *want_domain;
/* The newest API both the loaded libfabric and the provider (1.18) know:
 * libfabric refuses a version newer than its own. */
static uint32_t api;

/* Hints that name the provider, as FI_PROVIDER=xrc does. */
static struct fi_info *xrc_hints(void)
{
    struct fi_info *h = fi_allocinfo();
    if (!h) {
        fprintf(stderr, "fi_allocinfo failed\n");
        exit(2);
    }
    h->fabric_attr->prov_name = strdup("xrc");
    return h;
}

/* fi_getinfo with these hints; the count of answers from the provider, each
 * checked to be ours and on the wanted domain. */
static int ask(uint32_t version, struct fi_info *hints, struct fi_info **out)
{
    int rc = fi_getinfo(version, NULL, NULL, 0, hints, out);
    if (rc) {
        *out = NULL;
        return rc;
    }
    int n = 0;
    for (struct fi_info *i = *out; i; i = i->next, n++) {
        CHECK(!strcmp(i->fabric_attr->prov_name, "xrc"), "provider %s", i->fabric_attr->prov_name);
        CHECK(!strcmp(i->fabric_attr->name, "xrc"), "fabric %s", i->fabric_attr->name);
        CHECK(i->ep_attr->type == FI_EP_RDM, "ep type %d", (int) i->ep_attr->type);
        CHECK(i->domain_attr->data_progress == FI_PROGRESS_MANUAL, "progress");
    }
    return n;
}

static struct fi_info *the_domain(struct fi_info *list)
{
    for (struct fi_info *i = list; i; i = i->next) {
        if (!strcmp(i->domain_attr->name, want_domain)) {
            return i;
        }
    }
    return NULL;
}

static void no_hints(void)
{
    struct fi_info *h = xrc_hints(), *out;
    /* Hints with a domain attribute whose mr_mode is 0 take no mode bit,
     * so they get no remote access (libfabric's getinfo test checks
     * this); the modes remote access needs bring it. */
    int n = ask(api, h, &out);
    CHECK(n >= 1, "no answer: %s", fi_strerror(-n));
    for (struct fi_info *i = out; n >= 1 && i; i = i->next)
        CHECK(!(i->caps & (FI_RMA | FI_ATOMIC)) && !i->domain_attr->mr_mode, "mr_mode 0: caps %#llx, mr_mode %#x",
              (unsigned long long) i->caps, (unsigned) i->domain_attr->mr_mode);
    if (n >= 1)
        fi_freeinfo(out);
    h->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    n = ask(api, h, &out);
    CHECK(n >= 1, "no answer: %s", fi_strerror(-n));
    struct fi_info *i = the_domain(out);
    CHECK(i != NULL, "domain %s is not offered", want_domain);
    if (i) {
        CHECK((i->caps & (FI_MSG | FI_TAGGED | FI_RMA)) == (FI_MSG | FI_TAGGED | FI_RMA), "caps %#llx",
              (unsigned long long) i->caps);
        CHECK(i->caps & FI_MULTI_RECV, "no FI_MULTI_RECV");
        CHECK(i->caps & FI_DIRECTED_RECV, "no FI_DIRECTED_RECV");
        CHECK(i->caps & FI_SOURCE, "no FI_SOURCE");
        CHECK(i->domain_attr->cq_data_size >= 4, "cq_data_size %zu", i->domain_attr->cq_data_size);
        CHECK(!(i->domain_attr->mr_mode & FI_MR_LOCAL), "the provider asks for FI_MR_LOCAL");
        CHECK(i->mode == 0, "mode %#llx", (unsigned long long) i->mode);
        CHECK(i->tx_attr->inject_size > 0, "no inject");
        CHECK(i->domain_attr->threading == FI_THREAD_DOMAIN, "threading %d", i->domain_attr->threading);

        /* A copy, as newer libfabric copies ours, then both freed. */
        struct fi_info *dup = fi_dupinfo(i);
        CHECK(dup != NULL, "fi_dupinfo");
        if (dup) {
            CHECK(!strcmp(dup->domain_attr->name, want_domain), "dup domain");
            CHECK(dup->caps == i->caps, "dup caps");
            fi_freeinfo(dup);
        }
    }
    fi_freeinfo(out);
    fi_freeinfo(h);
}

/* Open MPI 4.1.4's mtl/ofi: tagged, no registration asked of it, threading
 * domain, AV map, context modes offered. */
static void ompi_mtl(void)
{
    struct fi_info *h = xrc_hints(), *out;
    h->caps = FI_TAGGED | FI_DIRECTED_RECV;
    h->mode = FI_CONTEXT | FI_CONTEXT2;
    h->ep_attr->type = FI_EP_RDM;
    h->tx_attr->msg_order = FI_ORDER_SAS;
    h->rx_attr->msg_order = FI_ORDER_SAS;
    h->tx_attr->op_flags = FI_COMPLETION;
    h->rx_attr->op_flags = FI_COMPLETION;
    h->domain_attr->threading = FI_THREAD_DOMAIN;
    h->domain_attr->av_type = FI_AV_MAP;
    h->domain_attr->mr_mode = 0;
    h->domain_attr->cq_data_size = 4;
    int n = ask(FI_VERSION(1, 5), h, &out);
    CHECK(n >= 1, "mtl/ofi hints: %s", fi_strerror(-n));
    struct fi_info *i = the_domain(out);
    CHECK(i != NULL, "domain %s is not offered to mtl/ofi", want_domain);
    if (i) {
        CHECK(i->caps & FI_TAGGED, "no FI_TAGGED");
        CHECK(!(i->caps & (FI_RMA | FI_ATOMIC)), "remote access without the MR modes: caps %#llx",
              (unsigned long long) i->caps);
        CHECK(i->domain_attr->mr_mode == 0, "mr_mode %#x", i->domain_attr->mr_mode);
        CHECK(i->domain_attr->av_type == FI_AV_MAP, "av_type %d", i->domain_attr->av_type);
        CHECK((i->mode & ~(FI_CONTEXT | FI_CONTEXT2)) == 0, "mode %#llx", (unsigned long long) i->mode);
    }
    fi_freeinfo(out);
    fi_freeinfo(h);
}

/* Open MPI 4.1.4's btl/ofi: RMA (and atomics, where the device has them) on
 * registered memory, delivery complete. */
static void ompi_btl(uint64_t caps, int offered)
{
    struct fi_info *h = xrc_hints(), *out;
    h->caps = caps;
    h->ep_attr->type = FI_EP_RDM;
    h->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
    h->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    h->domain_attr->threading = FI_THREAD_SAFE;
    int n = ask(FI_VERSION(1, 5), h, &out);
    struct fi_info *i = n >= 1 ? the_domain(out) : NULL;
    if (!offered) {
        CHECK(i == NULL, "caps %#llx offered on a device without them", (unsigned long long) caps);
    } else if (!i) {
        CHECK(0, "domain %s is not offered to btl/ofi (caps %#llx): %s", want_domain, (unsigned long long) caps,
              n < 0 ? fi_strerror(-n) : "other domains only");
    } else {
        CHECK((i->caps & caps) == caps, "caps %#llx", (unsigned long long) i->caps);
        CHECK(i->domain_attr->mr_mode == (FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY), "mr_mode %#x",
              i->domain_attr->mr_mode);
        CHECK(i->tx_attr->op_flags == FI_DELIVERY_COMPLETE, "op_flags %#llx",
              (unsigned long long) i->tx_attr->op_flags);
        CHECK(i->domain_attr->threading == FI_THREAD_SAFE, "threading %d", i->domain_attr->threading);
    }
    if (n >= 1) {
        fi_freeinfo(out);
    }
    fi_freeinfo(h);
}

/* MPICH ch4:ofi: the threading level comes back exactly as asked. */
static void mpich(void)
{
    struct fi_info *h = xrc_hints(), *out;
    h->caps = FI_MSG | FI_MULTI_RECV | FI_TAGGED | FI_DIRECTED_RECV | FI_RMA;
    h->mode = FI_CONTEXT | FI_ASYNC_IOV | FI_RX_CQ_DATA | FI_CONTEXT2;
    h->ep_attr->type = FI_EP_RDM;
    h->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    h->domain_attr->threading = FI_THREAD_DOMAIN;
    h->domain_attr->av_type = FI_AV_TABLE;
    h->domain_attr->control_progress = FI_PROGRESS_MANUAL;
    h->domain_attr->data_progress = FI_PROGRESS_MANUAL;
    h->tx_attr->op_flags = FI_COMPLETION | FI_DELIVERY_COMPLETE;
    h->tx_attr->msg_order = FI_ORDER_SAS;
    int n = ask(api, h, &out);
    CHECK(n >= 1, "MPICH hints: %s", fi_strerror(-n));
    struct fi_info *i = the_domain(out);
    CHECK(i != NULL, "domain %s is not offered to MPICH", want_domain);
    if (i) {
        CHECK(i->domain_attr->threading == FI_THREAD_DOMAIN, "threading %d", i->domain_attr->threading);
        CHECK(i->domain_attr->av_type == FI_AV_TABLE, "av_type %d", i->domain_attr->av_type);
        CHECK(i->caps & FI_MULTI_RECV, "no FI_MULTI_RECV");
        CHECK(!(i->domain_attr->mr_mode & FI_MR_LOCAL), "FI_MR_LOCAL asked of MPICH");
    }
    fi_freeinfo(out);
    fi_freeinfo(h);
}

/* What no device offers: refused as a whole. */
static void refused(void)
{
    struct {
        const char *what;
        void (*set)(struct fi_info *);
    } cases[] = {
        {"FI_EP_MSG", NULL},
        {"FI_EP_DGRAM", NULL},
        {"auto progress", NULL},
        {"FI_SOCKADDR_IN", NULL},
        {"a larger cq_data_size", NULL},
        {"an unknown domain", NULL},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct fi_info *h = xrc_hints(), *out = NULL;
        switch (k) {
        case 0: h->ep_attr->type = FI_EP_MSG; break;
        case 1: h->ep_attr->type = FI_EP_DGRAM; break;
        case 2: h->domain_attr->data_progress = FI_PROGRESS_AUTO; break;
        case 3: h->addr_format = FI_SOCKADDR_IN; break;
        case 4: h->domain_attr->cq_data_size = 16; break;
        case 5: h->domain_attr->name = strdup("no-such-device"); break;
        }
        int rc = fi_getinfo(api, NULL, NULL, 0, h, &out);
        CHECK(rc == -FI_ENODATA, "%s: got %d (%s), not -FI_ENODATA", cases[k].what, rc, fi_strerror(-rc));
        if (!rc) {
            fi_freeinfo(out);
        }
        fi_freeinfo(h);
    }
}

/* The fabric opens from an answer and closes. */
static void fabric(void)
{
    struct fi_info *h = xrc_hints(), *out;
    int n = ask(api, h, &out);
    CHECK(n >= 1, "no answer");
    if (n >= 1) {
        struct fid_fabric *fab = NULL;
        int rc = fi_fabric(out->fabric_attr, &fab, NULL);
        CHECK(rc == 0 && fab, "fi_fabric: %s", fi_strerror(-rc));
        if (!rc) {
            CHECK(fab->fid.fclass == FI_CLASS_FABRIC, "fclass %zu", fab->fid.fclass);
            rc = fi_close(&fab->fid);
            CHECK(rc == 0, "fi_close(fabric): %s", fi_strerror(-rc));
        }
        fi_freeinfo(out);
    }
    fi_freeinfo(h);
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3 || (argc == 3 && strcmp(argv[2], "noatomics"))) {
        fprintf(stderr, "usage: getinfo DOMAIN [noatomics]\n");
        return 2;
    }
    want_domain = argv[1];
    api = fi_version() < FI_VERSION(1, 18) ? fi_version() : FI_VERSION(1, 18);
    int atomics = argc == 2;
    no_hints();
    ompi_mtl();
    ompi_btl(FI_RMA, 1);
    ompi_btl(FI_RMA | FI_ATOMIC, atomics);
    mpich();
    refused();
    fabric();
    if (failures) {
        fprintf(stderr, "getinfo: %d failures\n", failures);
        return 1;
    }
    printf("getinfo: passed on %s (libfabric %u.%u)\n", want_domain, FI_MAJOR(fi_version()),
           FI_MINOR(fi_version()));
    return 0;
}
