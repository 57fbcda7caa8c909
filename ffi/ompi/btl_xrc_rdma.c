/*
 * mca_btl_xrc: put, get and 64-bit atomics. Each starts one xrcbtl
 * operation whose completion calls the caller's callback from progress;
 * a refusal for lack of resources is OPAL_ERR_OUT_OF_RESOURCE, which ob1
 * and osc/rdma retry.
 *
 * A NULL remote handle: osc/rdma passes none for a window it reaches at
 * remote_address in this process (its own window when every rank is on one
 * node, or a window in shared memory). The work then goes through this
 * rank's loopback on a registration of that address, so that it is atomic
 * with the device's atomics from the other ranks. Refusing it would make
 * osc/rdma fall back to a CPU compare-and-swap, which a peer's
 * compare-and-swap through the device does not see: both could win.
 */
#include "btl_xrc.h"

#include <stdlib.h>

/* What a completion needs to call back. */
typedef struct xrc_rdma_ctx_t {
    mca_btl_xrc_module_t *m;
    mca_btl_base_endpoint_t *ep;
    void *local_address;
    mca_btl_base_registration_handle_t *local_handle;
    mca_btl_base_rdma_completion_fn_t cbfunc;
    void *cbcontext;
    void *cbdata;
    /* A fetching atomic stores the value it found at local_address. */
    int fetch;
    /* Registered here for a caller that passed no local handle. */
    int own_registration;
    xrcbtl_mem_t reg;
    /* Registered here for a caller that passed no remote handle, and the
     * packed handle made of it. */
    int own_remote;
    xrcbtl_mem_t rreg;
    uint8_t rbytes[XRCBTL_REMOTE_MEM_SIZE];
} xrc_rdma_ctx_t;

static xrc_rdma_ctx_t *ctx_new(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep, void *local_address,
                               mca_btl_base_registration_handle_t *local_handle,
                               mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext, void *cbdata)
{
    xrc_rdma_ctx_t *c = malloc(sizeof *c);
    if (NULL == c) {
        return NULL;
    }
    c->m = (mca_btl_xrc_module_t *) btl;
    c->ep = ep;
    c->local_address = local_address;
    c->local_handle = local_handle;
    c->cbfunc = cbfunc;
    c->cbcontext = cbcontext;
    c->cbdata = cbdata;
    c->fetch = 0;
    c->own_registration = 0;
    c->own_remote = 0;
    return c;
}

static void ctx_free(xrc_rdma_ctx_t *c)
{
    if (c->own_registration) {
        (void) xrcbtl_deregister_mem(c->m->xrc, &c->reg);
    }
    if (c->own_remote) {
        (void) xrcbtl_deregister_mem(c->m->xrc, &c->rreg);
    }
    free(c);
}

static void on_done(xrcbtl_t *xrc, uint64_t op, int status, uint64_t value, void *arg)
{
    xrc_rdma_ctx_t *c = arg;
    (void) xrc; (void) op;

    if (c->fetch && XRCBTL_OK == status) {
        *(uint64_t *) c->local_address = value;
    }
    if (NULL != c->cbfunc) {
        c->cbfunc(&c->m->super, c->ep, c->local_address, c->local_handle, c->cbcontext, c->cbdata,
                  mca_btl_xrc_rc(status));
    }
    ctx_free(c);
}

/* The local registration of a transfer: the caller's, or one made now
 * (xrcbtl's cache makes that cheap) for memory it did not register. */
static const xrcbtl_mem_t *local_reg(xrc_rdma_ctx_t *c, void *addr, size_t size)
{
    if (NULL != c->local_handle) {
        return &c->local_handle->local;
    }
    if (XRCBTL_OK != xrcbtl_register_mem(c->m->xrc, addr, size, 0, &c->reg)) {
        return NULL;
    }
    c->own_registration = 1;
    return &c->reg;
}

/* Sets the rank a transfer goes to and the packed handle of its target:
 * the caller's, or, for a caller that passed none, a registration made now
 * (through xrcbtl's cache) of `size` bytes at `addr` in this process,
 * reached through this rank's loopback (see the top of this file). Returns
 * an xrcbtl status. */
static int remote_of(xrc_rdma_ctx_t *c, mca_btl_base_registration_handle_t *handle, uint64_t addr, size_t size,
                     uint32_t access, uint32_t *dst, const uint8_t **remote)
{
    int rc;

    if (NULL != handle) {
        *dst = c->ep->rank;
        *remote = handle->remote;
        return XRCBTL_OK;
    }
    rc = xrcbtl_register_mem(c->m->xrc, (void *) (uintptr_t) addr, size, access, &c->rreg);
    if (XRCBTL_OK != rc) {
        return rc;
    }
    c->own_remote = 1;
    *dst = c->m->info.rank;
    *remote = c->rbytes;
    return xrcbtl_mem_pack(&c->rreg, c->rbytes);
}

/* The end of a start: `c` is freed if the operation did not start. If it
 * did, `c` is the completion's, which may already have run and freed it on
 * another thread (MPI_THREAD_MULTIPLE): nothing here or after reads it, and
 * `counter` was found without it. */
static int started(xrc_rdma_ctx_t *c, const char *what, int status, volatile int64_t *counter)
{
    if (XRCBTL_OK != status) {
        /* A full queue is routine (the caller retries); anything else is
         * an error the caller passes up, often as a bare MPI error class:
         * the log says what xrcbtl refused and why. */
        if (XRCBTL_ERR_AGAIN != status) {
            mca_btl_xrc_log_failure(what, status);
        }
        ctx_free(c);
        return mca_btl_xrc_rc(status);
    }
    (void) OPAL_THREAD_ADD_FETCH64(counter, 1);
    return OPAL_SUCCESS;
}

int mca_btl_xrc_put(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep, void *local_address,
                    uint64_t remote_address, mca_btl_base_registration_handle_t *local_handle,
                    mca_btl_base_registration_handle_t *remote_handle, size_t size, int flags, int order,
                    mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext, void *cbdata)
{
    mca_btl_xrc_module_t *m = (mca_btl_xrc_module_t *) btl;
    xrc_rdma_ctx_t *c = ctx_new(btl, ep, local_address, local_handle, cbfunc, cbcontext, cbdata);
    const xrcbtl_mem_t *reg;
    const uint8_t *remote;
    uint32_t dst;
    int rc;
    (void) flags; (void) order;

    if (NULL == c) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    if (NULL == (reg = local_reg(c, local_address, size))) {
        return started(c, "local registration", XRCBTL_ERR_AGAIN, NULL);
    }
    rc = remote_of(c, remote_handle, remote_address, size, XRCBTL_ACCESS_REMOTE_WRITE, &dst, &remote);
    if (XRCBTL_OK == rc) {
        rc = xrcbtl_put(m->xrc, dst, reg, local_address, remote, remote_address, size, on_done, c, NULL);
    }
    return started(c, "put", rc, &m->counters.puts);
}

int mca_btl_xrc_get(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep, void *local_address,
                    uint64_t remote_address, mca_btl_base_registration_handle_t *local_handle,
                    mca_btl_base_registration_handle_t *remote_handle, size_t size, int flags, int order,
                    mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext, void *cbdata)
{
    mca_btl_xrc_module_t *m = (mca_btl_xrc_module_t *) btl;
    xrc_rdma_ctx_t *c = ctx_new(btl, ep, local_address, local_handle, cbfunc, cbcontext, cbdata);
    const xrcbtl_mem_t *reg;
    const uint8_t *remote;
    uint32_t dst;
    int rc;
    (void) flags; (void) order;

    if (NULL == c) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    if (NULL == (reg = local_reg(c, local_address, size))) {
        return started(c, "local registration", XRCBTL_ERR_AGAIN, NULL);
    }
    rc = remote_of(c, remote_handle, remote_address, size, XRCBTL_ACCESS_REMOTE_READ, &dst, &remote);
    if (XRCBTL_OK == rc) {
        rc = xrcbtl_get(m->xrc, dst, reg, local_address, remote, remote_address, size, on_done, c, NULL);
    }
    return started(c, "get", rc, &m->counters.gets);
}

/* Only 64-bit add and compare-and-swap are advertised
 * (btl_atomic_flags); anything else is refused. */
static int atomic_unsupported(mca_btl_xrc_module_t *m, mca_btl_base_atomic_op_t op, int flags)
{
    return !(m->info.flags & XRCBTL_INFO_ATOMICS) || MCA_BTL_ATOMIC_ADD != op ||
           (flags & MCA_BTL_ATOMIC_FLAG_32BIT);
}

int mca_btl_xrc_aop(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep, uint64_t remote_address,
                    mca_btl_base_registration_handle_t *remote_handle, mca_btl_base_atomic_op_t op,
                    uint64_t operand, int flags, int order, mca_btl_base_rdma_completion_fn_t cbfunc,
                    void *cbcontext, void *cbdata)
{
    mca_btl_xrc_module_t *m = (mca_btl_xrc_module_t *) btl;
    xrc_rdma_ctx_t *c;
    const uint8_t *remote;
    uint32_t dst;
    int rc;
    (void) order;

    if (atomic_unsupported(m, op, flags)) {
        return OPAL_ERR_NOT_SUPPORTED;
    }
    if (NULL == (c = ctx_new(btl, ep, NULL, NULL, cbfunc, cbcontext, cbdata))) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    rc = remote_of(c, remote_handle, remote_address, 8, XRCBTL_ACCESS_REMOTE_ATOMIC, &dst, &remote);
    if (XRCBTL_OK == rc) {
        rc = xrcbtl_atomic_add(m->xrc, dst, remote, remote_address, operand, on_done, c, NULL);
    }
    return started(c, "atomic add", rc, &m->counters.atomics);
}

int mca_btl_xrc_afop(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep, void *local_address,
                     uint64_t remote_address, mca_btl_base_registration_handle_t *local_handle,
                     mca_btl_base_registration_handle_t *remote_handle, mca_btl_base_atomic_op_t op,
                     uint64_t operand, int flags, int order, mca_btl_base_rdma_completion_fn_t cbfunc,
                     void *cbcontext, void *cbdata)
{
    mca_btl_xrc_module_t *m = (mca_btl_xrc_module_t *) btl;
    xrc_rdma_ctx_t *c;
    const uint8_t *remote;
    uint32_t dst;
    int rc;
    (void) order;

    if (atomic_unsupported(m, op, flags)) {
        return OPAL_ERR_NOT_SUPPORTED;
    }
    if (NULL == (c = ctx_new(btl, ep, local_address, local_handle, cbfunc, cbcontext, cbdata))) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    c->fetch = 1;
    rc = remote_of(c, remote_handle, remote_address, 8, XRCBTL_ACCESS_REMOTE_ATOMIC, &dst, &remote);
    if (XRCBTL_OK == rc) {
        rc = xrcbtl_fetch_add(m->xrc, dst, remote, remote_address, operand, on_done, c, NULL);
    }
    return started(c, "atomic fetch-add", rc, &m->counters.atomics);
}

int mca_btl_xrc_acswap(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep, void *local_address,
                       uint64_t remote_address, mca_btl_base_registration_handle_t *local_handle,
                       mca_btl_base_registration_handle_t *remote_handle, uint64_t compare, uint64_t value,
                       int flags, int order, mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext,
                       void *cbdata)
{
    mca_btl_xrc_module_t *m = (mca_btl_xrc_module_t *) btl;
    xrc_rdma_ctx_t *c;
    const uint8_t *remote;
    uint32_t dst;
    int rc;
    (void) order;

    if (atomic_unsupported(m, MCA_BTL_ATOMIC_ADD, flags)) {
        return OPAL_ERR_NOT_SUPPORTED;
    }
    if (NULL == (c = ctx_new(btl, ep, local_address, local_handle, cbfunc, cbcontext, cbdata))) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    c->fetch = 1;
    rc = remote_of(c, remote_handle, remote_address, 8, XRCBTL_ACCESS_REMOTE_ATOMIC, &dst, &remote);
    if (XRCBTL_OK == rc) {
        rc = xrcbtl_compare_swap(m->xrc, dst, remote, remote_address, compare, value, on_done, c, NULL);
    }
    return started(c, "atomic compare-and-swap", rc, &m->counters.atomics);
}
