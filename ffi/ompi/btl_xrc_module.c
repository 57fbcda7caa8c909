/*
 * mca_btl_xrc: the module. Peers (add_procs reads each peer's address from
 * the modex and hands it to xrcbtl; connections come on first use), memory
 * registration (xrcbtl's cache, kept coherent with freed and unmapped
 * memory by its memory monitor), flush, the error callback, finalize.
 */
#include "btl_xrc.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "opal/class/opal_bitmap.h"
#include "opal/mca/btl/base/base.h"
#include "opal/mca/pmix/pmix.h"

static int xrc_add_procs(mca_btl_base_module_t *btl, size_t nprocs, opal_proc_t **procs,
                         mca_btl_base_endpoint_t **peers, opal_bitmap_t *reachable);
static int xrc_del_procs(mca_btl_base_module_t *btl, size_t nprocs, opal_proc_t **procs,
                         mca_btl_base_endpoint_t **peers);
static int xrc_register_am(mca_btl_base_module_t *btl, mca_btl_base_tag_t tag,
                           mca_btl_base_module_recv_cb_fn_t cbfunc, void *cbdata);
static int xrc_finalize(mca_btl_base_module_t *btl);
static int xrc_register_error(mca_btl_base_module_t *btl, mca_btl_base_module_error_cb_fn_t cbfunc);
static mca_btl_base_registration_handle_t *xrc_register_mem(mca_btl_base_module_t *btl,
                                                            mca_btl_base_endpoint_t *ep, void *base,
                                                            size_t size, uint32_t flags);
static int xrc_deregister_mem(mca_btl_base_module_t *btl, mca_btl_base_registration_handle_t *handle);
static int xrc_flush(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep);

mca_btl_xrc_module_t mca_btl_xrc_module_template = {
    .super = {
        .btl_component = &mca_btl_xrc_component.super,
        /* Sizes include ob1's header; init caps them at what xrcbtl sends
         * eagerly. Larger contiguous messages go by RDMA get (RGET), on
         * iWARP by ob1's put pipeline (init drops GET there). */
        .btl_eager_limit = 8192,
        .btl_rndv_eager_limit = 8192,
        .btl_max_send_size = 8192,
        .btl_rdma_pipeline_send_length = 1024 * 1024,
        .btl_rdma_pipeline_frag_size = 1024 * 1024,
        .btl_min_rdma_pipeline_size = 256 * 1024,
        /* Above tcp's (100): ob1 drops tcp for every peer xrc reaches. */
        .btl_exclusivity = MCA_BTL_EXCLUSIVITY_DEFAULT,
        .btl_latency = 2,
        .btl_bandwidth = 10000,
        .btl_flags = MCA_BTL_FLAGS_SEND | MCA_BTL_FLAGS_PUT | MCA_BTL_FLAGS_GET | MCA_BTL_FLAGS_RDMA_FLUSH |
                     MCA_BTL_FLAGS_ATOMIC_OPS | MCA_BTL_FLAGS_ATOMIC_FOPS,
        .btl_atomic_flags = MCA_BTL_ATOMIC_SUPPORTS_ADD | MCA_BTL_ATOMIC_SUPPORTS_CSWAP,
        .btl_registration_handle_size = XRCBTL_REMOTE_MEM_SIZE,
        .btl_get_limit = 1 << 30,
        .btl_put_limit = 1 << 30,

        .btl_add_procs = xrc_add_procs,
        .btl_del_procs = xrc_del_procs,
        .btl_register = xrc_register_am,
        .btl_finalize = xrc_finalize,
        .btl_alloc = mca_btl_xrc_alloc,
        .btl_free = mca_btl_xrc_free,
        .btl_prepare_src = mca_btl_xrc_prepare_src,
        .btl_send = mca_btl_xrc_send,
        .btl_sendi = mca_btl_xrc_sendi,
        .btl_put = mca_btl_xrc_put,
        .btl_get = mca_btl_xrc_get,
        .btl_dump = mca_btl_base_dump,
        .btl_atomic_op = mca_btl_xrc_aop,
        .btl_atomic_fop = mca_btl_xrc_afop,
        .btl_atomic_cswap = mca_btl_xrc_acswap,
        .btl_register_mem = xrc_register_mem,
        .btl_deregister_mem = xrc_deregister_mem,
        .btl_register_error = xrc_register_error,
        .btl_flush = xrc_flush,
    },
};

static void on_peer_failed(xrcbtl_t *xrc, uint32_t rank, int status, const char *reason, void *arg);
static size_t resolve_peer(xrcbtl_t *xrc, uint32_t rank, void *buf, size_t cap, void *arg);

int mca_btl_xrc_module_init(mca_btl_xrc_module_t *m)
{
    int rc;

    OBJ_CONSTRUCT(&m->ep_lock, opal_mutex_t);
    OBJ_CONSTRUCT(&m->done_lock, opal_mutex_t);
    OBJ_CONSTRUCT(&m->done, opal_list_t);
    OBJ_CONSTRUCT(&m->frags, opal_free_list_t);
    m->eps = NULL;
    m->eps_len = 0;
    m->done_count = 0;
    m->error_cb = NULL;
    memset((void *) &m->counters, 0, sizeof m->counters);
    memset(&m->recv_des, 0, sizeof m->recv_des);
    memset(&m->recv_seg, 0, sizeof m->recv_seg);
    m->recv_des.des_segments = &m->recv_seg;
    m->recv_des.des_segment_count = 1;
    rc = opal_free_list_init(&m->frags, sizeof(mca_btl_xrc_frag_t) + m->super.btl_max_send_size, opal_cache_line_size,
                             OBJ_CLASS(mca_btl_xrc_frag_t), 0, 0, 64, -1, 64, NULL, 0, NULL, NULL, NULL);
    if (OPAL_SUCCESS != rc) {
        return rc;
    }
    /* One receive path for every tag: it reads the trigger table that the
     * BML fills (btl_register only tells us a tag is in use). */
    for (int tag = 0; tag < MCA_BTL_TAG_MAX; tag++) {
        rc = xrcbtl_register_am(m->xrc, (uint8_t) tag, mca_btl_xrc_receive, m);
        if (XRCBTL_OK != rc) {
            return mca_btl_xrc_rc(rc);
        }
    }
    rc = xrcbtl_set_peer_resolver(m->xrc, resolve_peer, m);
    if (XRCBTL_OK != rc) {
        return mca_btl_xrc_rc(rc);
    }
    return mca_btl_xrc_rc(xrcbtl_set_error_callback(m->xrc, on_peer_failed, m));
}

struct mca_btl_base_endpoint_t *mca_btl_xrc_endpoint_of_rank(mca_btl_xrc_module_t *m, uint32_t rank)
{
    struct mca_btl_base_endpoint_t *ep = NULL;
    OPAL_THREAD_LOCK(&m->ep_lock);
    if (rank < m->eps_len) {
        ep = m->eps[rank];
    }
    OPAL_THREAD_UNLOCK(&m->ep_lock);
    return ep;
}

/* The endpoint of proc, made (from its modex address) on first sight.
 * Called with ep_lock held. */
static struct mca_btl_base_endpoint_t *endpoint_for(mca_btl_xrc_module_t *m, opal_proc_t *proc)
{
    uint32_t rank = proc->proc_name.vpid;
    struct mca_btl_base_endpoint_t *ep;
    uint8_t *addr = NULL;
    size_t len = 0;
    int rc;

    if (rank < m->eps_len && NULL != m->eps[rank]) {
        return m->eps[rank];
    }
    if (proc == opal_proc_local_get()) {
        /* xrcbtl always knows its own rank. */
        goto make;
    }
    if (proc->proc_name.jobid != OPAL_PROC_MY_NAME.jobid) {
        /* Another job (MPI_Comm_spawn): ranks are vpids of one job only. */
        XRC_VERBOSE(2, "%s is in another job: not reachable", OPAL_NAME_PRINT(proc->proc_name));
        return NULL;
    }
    OPAL_MODEX_RECV(rc, &mca_btl_xrc_component.super.btl_version, &proc->proc_name, (void **) &addr, &len);
    if (OPAL_SUCCESS != rc || NULL == addr) {
        XRC_VERBOSE(2, "no xrc address from %s: not reachable", OPAL_NAME_PRINT(proc->proc_name));
        return NULL;
    }
    rc = xrcbtl_add_peer(m->xrc, rank, addr, len);
    free(addr);
    if (XRCBTL_OK != rc) {
        char msg[256];
        xrcbtl_last_error(msg, sizeof msg);
        XRC_VERBOSE(1, "peer %s refused: %s", OPAL_NAME_PRINT(proc->proc_name), msg);
        return NULL;
    }
make:
    if (rank >= m->eps_len) {
        uint32_t len2 = m->eps_len ? m->eps_len : 16;
        struct mca_btl_base_endpoint_t **grown;
        while (len2 <= rank) len2 *= 2;
        grown = realloc(m->eps, len2 * sizeof *grown);
        if (NULL == grown) {
            return NULL;
        }
        memset(grown + m->eps_len, 0, (len2 - m->eps_len) * sizeof *grown);
        m->eps = grown;
        m->eps_len = len2;
    }
    ep = calloc(1, sizeof *ep);
    if (NULL == ep) {
        return NULL;
    }
    ep->proc = proc;
    ep->rank = rank;
    m->eps[rank] = ep;
    (void) OPAL_THREAD_ADD_FETCH64(&m->counters.add_procs, 1);
    XRC_VERBOSE(2, "peer %s (rank %u) on %s", OPAL_NAME_PRINT(proc->proc_name), rank,
                proc->proc_hostname ? proc->proc_hostname : "?");
    return ep;
}

/* ob1 calls this at MPI_Init for local peers and later, one peer at a time
 * and possibly from inside progress, for the others (reachable is then
 * NULL). Endpoints cost nothing until used. */
static int xrc_add_procs(mca_btl_base_module_t *btl, size_t nprocs, opal_proc_t **procs,
                         mca_btl_base_endpoint_t **peers, opal_bitmap_t *reachable)
{
    mca_btl_xrc_module_t *m = (mca_btl_xrc_module_t *) btl;

    OPAL_THREAD_LOCK(&m->ep_lock);
    for (size_t i = 0; i < nprocs; i++) {
        if (procs[i] == opal_proc_local_get() && !(m->info.flags & XRCBTL_INFO_ATOMICS)) {
            /* btl/self carries this rank's own traffic. With atomics, the
             * rank reaches itself too (xrcbtl's loopback): osc/rdma wants
             * one BTL with atomics that reaches every rank, itself
             * included, so that all atomics on a window go through the
             * device. ob1 still sends to itself through btl/self, whose
             * exclusivity is higher. */
            peers[i] = NULL;
            continue;
        }
        peers[i] = endpoint_for(m, procs[i]);
        if (NULL != peers[i] && NULL != reachable) {
            opal_bitmap_set_bit(reachable, (int) i);
        }
    }
    OPAL_THREAD_UNLOCK(&m->ep_lock);
    return OPAL_SUCCESS;
}

/* Drops endpoints locally (the peer may be gone already). */
static int xrc_del_procs(mca_btl_base_module_t *btl, size_t nprocs, opal_proc_t **procs,
                         mca_btl_base_endpoint_t **peers)
{
    mca_btl_xrc_module_t *m = (mca_btl_xrc_module_t *) btl;
    (void) procs;

    OPAL_THREAD_LOCK(&m->ep_lock);
    for (size_t i = 0; i < nprocs; i++) {
        mca_btl_base_endpoint_t *ep = peers[i];
        if (NULL == ep || ep->rank >= m->eps_len || m->eps[ep->rank] != ep) {
            continue;
        }
        (void) xrcbtl_del_peer(m->xrc, ep->rank);
        m->eps[ep->rank] = NULL;
        free(ep);
    }
    OPAL_THREAD_UNLOCK(&m->ep_lock);
    return OPAL_SUCCESS;
}

static int xrc_register_am(mca_btl_base_module_t *btl, mca_btl_base_tag_t tag,
                           mca_btl_base_module_recv_cb_fn_t cbfunc, void *cbdata)
{
    /* The BML wrote the trigger table already; every tag is delivered
     * through it (mca_btl_xrc_receive). */
    (void) btl; (void) tag; (void) cbfunc; (void) cbdata;
    return OPAL_SUCCESS;
}

static int xrc_register_error(mca_btl_base_module_t *btl, mca_btl_base_module_error_cb_fn_t cbfunc)
{
    ((mca_btl_xrc_module_t *) btl)->error_cb = cbfunc;
    return OPAL_SUCCESS;
}

/* A peer failed for good (its process died, it is unreachable); a peer
 * that left cleanly is not reported. ob1 aborts the job here, naming the
 * peer. */
static void on_peer_failed(xrcbtl_t *xrc, uint32_t rank, int status, const char *reason, void *arg)
{
    mca_btl_xrc_module_t *m = arg;
    mca_btl_base_endpoint_t *ep = mca_btl_xrc_endpoint_of_rank(m, rank);
    char info[512];
    (void) xrc;

    snprintf(info, sizeof info, "xrc: connection to rank %u (%s) failed: %s (%s)", rank,
             (ep && ep->proc && ep->proc->proc_hostname) ? ep->proc->proc_hostname : "unknown host", reason,
             xrcbtl_strerror(status));
    opal_output(0, "%s", info);
    if (NULL != m->error_cb) {
        m->error_cb(&m->super, MCA_BTL_ERROR_FLAGS_FATAL, ep ? ep->proc : NULL, info);
    }
}

static mca_btl_base_registration_handle_t *xrc_register_mem(mca_btl_base_module_t *btl,
                                                            mca_btl_base_endpoint_t *ep, void *base,
                                                            size_t size, uint32_t flags)
{
    mca_btl_xrc_module_t *m = (mca_btl_xrc_module_t *) btl;
    mca_btl_base_registration_handle_t *h;
    uint32_t access = 0;
    int rc;
    (void) ep;

    if (flags & MCA_BTL_REG_FLAG_REMOTE_READ) access |= XRCBTL_ACCESS_REMOTE_READ;
    if (flags & MCA_BTL_REG_FLAG_REMOTE_WRITE) access |= XRCBTL_ACCESS_REMOTE_WRITE;
    if ((flags & MCA_BTL_REG_FLAG_REMOTE_ATOMIC) && (m->info.flags & XRCBTL_INFO_ATOMICS)) {
        access |= XRCBTL_ACCESS_REMOTE_ATOMIC;
    }
    h = malloc(sizeof *h);
    if (NULL == h) {
        return NULL;
    }
    rc = xrcbtl_register_mem(m->xrc, base, size, access, &h->local);
    if (XRCBTL_OK != rc) {
        char msg[256];
        xrcbtl_last_error(msg, sizeof msg);
        XRC_VERBOSE(1, "registration of %zu bytes at %p failed: %s", size, base, msg);
        free(h);
        return NULL;
    }
    (void) xrcbtl_mem_pack(&h->local, h->remote);
    (void) OPAL_THREAD_ADD_FETCH64(&m->counters.registrations, 1);
    return h;
}

static int xrc_deregister_mem(mca_btl_base_module_t *btl, mca_btl_base_registration_handle_t *handle)
{
    mca_btl_xrc_module_t *m = (mca_btl_xrc_module_t *) btl;
    int rc = xrcbtl_deregister_mem(m->xrc, &handle->local);
    free(handle);
    return mca_btl_xrc_rc(rc);
}

/* Every put, get and atomic started before has completed (callbacks may be
 * pending). xrcbtl's flush waits for all outstanding work, which includes
 * them. */
static int xrc_flush(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep)
{
    mca_btl_xrc_module_t *m = (mca_btl_xrc_module_t *) btl;
    (void) ep;
    return mca_btl_xrc_rc(xrcbtl_flush(m->xrc, 60u * 1000u * 1000u));
}

/* After del_procs and with progress unregistered: leave cleanly (bounded:
 * peers may be gone), release every verbs object, join xrcbtl's threads. */
static int xrc_finalize(mca_btl_base_module_t *btl)
{
    mca_btl_xrc_module_t *m = (mca_btl_xrc_module_t *) btl;
    mca_btl_xrc_counters_t *k = &m->counters;
    xrcbtl_stats_t st;
    int rc;

    (void) mca_btl_xrc_complete_sends(m);
    rc = xrcbtl_shutdown(m->xrc, (uint64_t) mca_btl_xrc_component.finalize_timeout_ms * 1000u);
    if (XRCBTL_OK != rc) {
        char msg[256];
        xrcbtl_last_error(msg, sizeof msg);
        XRC_VERBOSE(1, "leaving: %s (going anyway)", msg);
    }
    /* registrations counts ob1's and osc's register_mem calls; xrcbtl's
     * cache counts those and its own (zero-copy sends, loopback): a hit was
     * served from a region it held, a miss took a device registration. */
    memset(&st, 0, sizeof st);
    (void) xrcbtl_stats(m->xrc, &st);
    XRC_VERBOSE(1, "rank %u carried: sends %ld, sendi %ld, received %ld, puts %ld, gets %ld, atomics %ld, "
                   "registrations %ld, peers %ld; registration cache: hits %" PRIu64 ", misses %" PRIu64,
                m->info.rank, (long) k->sends, (long) k->sendi, (long) k->received, (long) k->puts, (long) k->gets,
                (long) k->atomics, (long) k->registrations, (long) k->add_procs, st.reg_hits, st.reg_misses);
    rc = xrcbtl_destroy(m->xrc);
    for (uint32_t i = 0; i < m->eps_len; i++) {
        free(m->eps[i]);
    }
    free(m->eps);
    OBJ_DESTRUCT(&m->frags);
    OBJ_DESTRUCT(&m->done);
    OBJ_DESTRUCT(&m->done_lock);
    OBJ_DESTRUCT(&m->ep_lock);
    if (mca_btl_xrc_component.module == m) {
        mca_btl_xrc_component.module = NULL;
    }
    free(m);
    return mca_btl_xrc_rc(rc);
}

/* ob1 adds a peer on another node when it first sends to it, so the first
 * message between two ranks may come from a rank this one has not added:
 * xrcbtl asks here, inside progress, and gets the address the rank
 * published in the modex. Must not call into xrcbtl. */
static size_t resolve_peer(xrcbtl_t *xrc, uint32_t rank, void *buf, size_t cap, void *arg)
{
    opal_process_name_t name = {.jobid = OPAL_PROC_MY_NAME.jobid, .vpid = rank};
    uint8_t *addr = NULL;
    size_t len = 0;
    int rc;
    (void) xrc;
    (void) arg;

    OPAL_MODEX_RECV(rc, &mca_btl_xrc_component.super.btl_version, &name, (void **) &addr, &len);
    if (OPAL_SUCCESS != rc || NULL == addr || len > cap) {
        XRC_VERBOSE(1, "rank %u asked to connect, but its xrc address is unknown", rank);
        free(addr);
        return 0;
    }
    memcpy(buf, addr, len);
    free(addr);
    XRC_VERBOSE(2, "rank %u asked to connect before it was added: found in the modex", rank);
    return len;
}
