/*
 * mca_btl_xrc: descriptors, sends and receives.
 *
 * xrcbtl_send copies a message when it is called (into a bounce buffer,
 * inline, or a queue while the connection is made), so a descriptor is
 * free again as soon as btl_send returns. Its completion is still
 * reported from the next progress call, never from inside btl_send, and
 * always with a callback: ob1 moves its pending sends on from send
 * callbacks (Open MPI issue #3845), and a callback inside btl_send would
 * re-enter ob1's scheduling.
 */
#include "btl_xrc.h"

#include <string.h>

#include "opal/datatype/opal_convertor.h"

static void frag_construct(mca_btl_xrc_frag_t *frag)
{
    frag->segment.seg_addr.pval = frag + 1;
    frag->segment.seg_len = 0;
    frag->base.des_segments = &frag->segment;
    frag->base.des_segment_count = 1;
    frag->endpoint = NULL;
}

OBJ_CLASS_INSTANCE(mca_btl_xrc_frag_t, mca_btl_base_descriptor_t, frag_construct, NULL);

mca_btl_base_descriptor_t *mca_btl_xrc_alloc(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep,
                                             uint8_t order, size_t size, uint32_t flags)
{
    mca_btl_xrc_module_t *m = (mca_btl_xrc_module_t *) btl;
    mca_btl_xrc_frag_t *frag;

    if (size > m->super.btl_max_send_size) {
        return NULL;
    }
    frag = (mca_btl_xrc_frag_t *) opal_free_list_get(&m->frags);
    if (NULL == frag) {
        return NULL;
    }
    frag->segment.seg_addr.pval = frag + 1;
    frag->segment.seg_len = size;
    frag->base.des_segments = &frag->segment;
    frag->base.des_segment_count = 1;
    frag->base.des_flags = flags;
    frag->base.des_cbfunc = NULL;
    frag->base.des_cbdata = NULL;
    frag->base.order = order;
    frag->endpoint = ep;
    return &frag->base;
}

int mca_btl_xrc_free(mca_btl_base_module_t *btl, mca_btl_base_descriptor_t *des)
{
    opal_free_list_return(&((mca_btl_xrc_module_t *) btl)->frags, &des->super);
    return OPAL_SUCCESS;
}

/* Packs `size` bytes of the convertor at `dst`; returns what it packed. */
static size_t pack(opal_convertor_t *convertor, void *dst, size_t size)
{
    struct iovec iov = {.iov_base = dst, .iov_len = size};
    uint32_t count = 1;
    size_t max = size;
    (void) opal_convertor_pack(convertor, &iov, &count, &max);
    return max;
}

mca_btl_base_descriptor_t *mca_btl_xrc_prepare_src(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep,
                                                   opal_convertor_t *convertor, uint8_t order,
                                                   size_t reserve, size_t *size, uint32_t flags)
{
    mca_btl_xrc_frag_t *frag;
    size_t room = btl->btl_max_send_size;

    if (reserve >= room) {
        return NULL;
    }
    if (*size > room - reserve) {
        *size = room - reserve;
    }
    frag = (mca_btl_xrc_frag_t *) mca_btl_xrc_alloc(btl, ep, order, reserve + *size, flags);
    if (NULL == frag) {
        return NULL;
    }
    *size = pack(convertor, (char *) (frag + 1) + reserve, *size);
    frag->segment.seg_len = reserve + *size;
    return &frag->base;
}

int mca_btl_xrc_send(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep, mca_btl_base_descriptor_t *des,
                     mca_btl_base_tag_t tag)
{
    mca_btl_xrc_module_t *m = (mca_btl_xrc_module_t *) btl;
    mca_btl_xrc_frag_t *frag = (mca_btl_xrc_frag_t *) des;
    int rc;

    rc = xrcbtl_send(m->xrc, ep->rank, tag, frag->segment.seg_addr.pval, frag->segment.seg_len, NULL, 0);
    if (XRCBTL_OK != rc) {
        /* Nothing kept: the caller still owns the descriptor. */
        return mca_btl_xrc_rc(rc);
    }
    frag->endpoint = ep;
    OPAL_THREAD_LOCK(&m->done_lock);
    m->counters.sends++;
    opal_list_append(&m->done, &des->super.super);
    (void) OPAL_THREAD_ADD_FETCH32(&m->done_count, 1);
    OPAL_THREAD_UNLOCK(&m->done_lock);
    return OPAL_SUCCESS;
}

/* Reports the sends that btl_send completed: callbacks, then the
 * descriptors the BTL owns go back to the free list. */
int mca_btl_xrc_complete_sends(mca_btl_xrc_module_t *m)
{
    opal_list_t done;
    opal_list_item_t *item;
    int n = 0;

    OBJ_CONSTRUCT(&done, opal_list_t);
    OPAL_THREAD_LOCK(&m->done_lock);
    opal_list_join(&done, opal_list_get_end(&done), &m->done);
    m->done_count = 0;
    OPAL_THREAD_UNLOCK(&m->done_lock);
    while (NULL != (item = opal_list_remove_first(&done))) {
        mca_btl_xrc_frag_t *frag = (mca_btl_xrc_frag_t *) item;
        mca_btl_base_descriptor_t *des = &frag->base;
        int own = des->des_flags & MCA_BTL_DES_FLAGS_BTL_OWNERSHIP;
        if (NULL != des->des_cbfunc) {
            des->des_cbfunc(&m->super, frag->endpoint, des, OPAL_SUCCESS);
        }
        if (own) {
            mca_btl_xrc_free(&m->super, des);
        }
        n++;
    }
    OBJ_DESTRUCT(&done);
    return n;
}

/* Sends at once: xrcbtl takes a copy (posting it inline or through a
 * bounce buffer when it can, else queueing it), so the answer is yes
 * unless the peer is gone. A refusal hands back a descriptor when it can,
 * with the convertor where it was. */
int mca_btl_xrc_sendi(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep, opal_convertor_t *convertor,
                      void *header, size_t header_size, size_t payload_size, uint8_t order, uint32_t flags,
                      mca_btl_base_tag_t tag, mca_btl_base_descriptor_t **descriptor)
{
    mca_btl_xrc_module_t *m = (mca_btl_xrc_module_t *) btl;
    const size_t total = header_size + payload_size;
    void *payload = NULL;
    mca_btl_base_descriptor_t *tmp = NULL;
    size_t position = 0;
    int rc = XRCBTL_ERR_AGAIN;

    if (total <= m->super.btl_max_send_size) {
        if (payload_size > 0 && !opal_convertor_need_buffers(convertor)) {
            opal_convertor_get_current_pointer(convertor, &payload);
        } else if (payload_size > 0) {
            /* Packed into a descriptor's buffer first. */
            tmp = mca_btl_xrc_alloc(btl, ep, order, payload_size, flags);
            if (NULL != tmp) {
                position = convertor->bConverted;
                payload = tmp->des_segments[0].seg_addr.pval;
                (void) pack(convertor, payload, payload_size);
            }
        }
        if (0 == payload_size || NULL != payload) {
            rc = xrcbtl_send(m->xrc, ep->rank, tag, header, header_size, payload, payload_size);
        }
        if (NULL != tmp) {
            if (XRCBTL_OK != rc) {
                (void) opal_convertor_set_position(convertor, &position);
            }
            mca_btl_xrc_free(btl, tmp);
        }
    }
    if (XRCBTL_OK == rc) {
        (void) OPAL_THREAD_ADD_FETCH64(&m->counters.sendi, 1);
        return OPAL_SUCCESS;
    }
    if (NULL != descriptor) {
        *descriptor = mca_btl_xrc_alloc(btl, ep, order, total, flags);
    }
    return XRCBTL_ERR_AGAIN == rc ? OPAL_ERR_OUT_OF_RESOURCE : mca_btl_xrc_rc(rc);
}

/* Every message, whatever its tag: the callback the BML registered for the
 * tag gets the module's receive descriptor, valid during the call. It may
 * send, add procs and progress; xrcbtl runs no other receive callback
 * until it returns, so the descriptor and the count are this call's. */
void mca_btl_xrc_receive(xrcbtl_t *xrc, uint32_t src, uint8_t tag, const void *data, size_t len, void *arg)
{
    mca_btl_xrc_module_t *m = arg;
    mca_btl_active_message_callback_t *reg = mca_btl_base_active_message_trigger + tag;
    (void) xrc; (void) src;

    m->recv_seg.seg_addr.pval = (void *) data;
    m->recv_seg.seg_len = len;
    m->counters.received++;
    if (NULL != reg->cbfunc) {
        reg->cbfunc(&m->super, tag, &m->recv_des, reg->cbdata);
    }
}
