/*
 * mca_btl_xrc: put, get and 64-bit atomics. Each starts one xrcbtl
 * operation whose completion calls the caller's callback from progress;
 * a refusal for lack of resources is OPAL_ERR_OUT_OF_RESOURCE, which ob1
 * and osc/rdma retry.
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
    return c;
}

static void ctx_free(xrc_rdma_ctx_t *c)
{
    if (c->own_registration) {
        (void) xrcbtl_deregister_mem(c->m->xrc, &c->reg);
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

static int started(xrc_rdma_ctx_t *c, int status, volatile int64_t *counter)
{
    if (XRCBTL_OK != status) {
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
    xrc_rdma_ctx_t *c = ctx_new(btl, ep, local_address, local_handle, cbfunc, cbcontext, cbdata);
    const xrcbtl_mem_t *reg;
    (void) flags; (void) order;

    if (NULL == c) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    if (NULL == (reg = local_reg(c, local_address, size))) {
        return started(c, XRCBTL_ERR_AGAIN, NULL);
    }
    return started(c,
                   xrcbtl_put(c->m->xrc, ep->rank, reg, local_address, remote_handle->remote, remote_address, size,
                              on_done, c, NULL),
                   &c->m->counters.puts);
}

int mca_btl_xrc_get(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep, void *local_address,
                    uint64_t remote_address, mca_btl_base_registration_handle_t *local_handle,
                    mca_btl_base_registration_handle_t *remote_handle, size_t size, int flags, int order,
                    mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext, void *cbdata)
{
    xrc_rdma_ctx_t *c = ctx_new(btl, ep, local_address, local_handle, cbfunc, cbcontext, cbdata);
    const xrcbtl_mem_t *reg;
    (void) flags; (void) order;

    if (NULL == c) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    if (NULL == (reg = local_reg(c, local_address, size))) {
        return started(c, XRCBTL_ERR_AGAIN, NULL);
    }
    return started(c,
                   xrcbtl_get(c->m->xrc, ep->rank, reg, local_address, remote_handle->remote, remote_address, size,
                              on_done, c, NULL),
                   &c->m->counters.gets);
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
    (void) order;

    if (atomic_unsupported(m, op, flags)) {
        return OPAL_ERR_NOT_SUPPORTED;
    }
    if (NULL == (c = ctx_new(btl, ep, NULL, NULL, cbfunc, cbcontext, cbdata))) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    return started(c, xrcbtl_atomic_add(m->xrc, ep->rank, remote_handle->remote, remote_address, operand, on_done, c,
                                        NULL),
                   &m->counters.atomics);
}

int mca_btl_xrc_afop(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep, void *local_address,
                     uint64_t remote_address, mca_btl_base_registration_handle_t *local_handle,
                     mca_btl_base_registration_handle_t *remote_handle, mca_btl_base_atomic_op_t op,
                     uint64_t operand, int flags, int order, mca_btl_base_rdma_completion_fn_t cbfunc,
                     void *cbcontext, void *cbdata)
{
    mca_btl_xrc_module_t *m = (mca_btl_xrc_module_t *) btl;
    xrc_rdma_ctx_t *c;
    (void) order;

    if (atomic_unsupported(m, op, flags)) {
        return OPAL_ERR_NOT_SUPPORTED;
    }
    if (NULL == (c = ctx_new(btl, ep, local_address, local_handle, cbfunc, cbcontext, cbdata))) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    c->fetch = 1;
    return started(c, xrcbtl_fetch_add(m->xrc, ep->rank, remote_handle->remote, remote_address, operand, on_done, c,
                                       NULL),
                   &m->counters.atomics);
}

int mca_btl_xrc_acswap(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep, void *local_address,
                       uint64_t remote_address, mca_btl_base_registration_handle_t *local_handle,
                       mca_btl_base_registration_handle_t *remote_handle, uint64_t compare, uint64_t value,
                       int flags, int order, mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext,
                       void *cbdata)
{
    mca_btl_xrc_module_t *m = (mca_btl_xrc_module_t *) btl;
    xrc_rdma_ctx_t *c;
    (void) order;

    if (atomic_unsupported(m, MCA_BTL_ATOMIC_ADD, flags)) {
        return OPAL_ERR_NOT_SUPPORTED;
    }
    if (NULL == (c = ctx_new(btl, ep, local_address, local_handle, cbfunc, cbcontext, cbdata))) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    c->fetch = 1;
    return started(c, xrcbtl_compare_swap(m->xrc, ep->rank, remote_handle->remote, remote_address, compare, value,
                                          on_done, c, NULL),
                   &m->counters.atomics);
}
