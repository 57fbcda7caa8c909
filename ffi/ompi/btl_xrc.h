/*
 * mca_btl_xrc: an Open MPI 4.1 BTL over xrcbtl's C ABI (xrcbtl.h).
 *
 * The component asks libxrcbtl for one rank on one verbs device, publishes
 * its address through the modex, and maps the BTL 3.1 contract onto the
 * ABI: active messages, eager sends (copied by xrcbtl), put/get on memory
 * registered through xrcbtl's registration cache, 64-bit atomics, flush.
 * Connections are made by xrcbtl on first use; endpoints are made lazily
 * in add_procs, which ob1 may call from inside progress.
 *
 * Files: btl_xrc_component.c (MCA parameters, init, progress),
 * btl_xrc_module.c (procs, registration, flush, finalize),
 * btl_xrc_frag.c (descriptors, send, sendi, receive),
 * btl_xrc_rdma.c (put, get, atomics).
 */
#ifndef MCA_BTL_XRC_H
#define MCA_BTL_XRC_H

#include "opal_config.h"

#include "opal/class/opal_free_list.h"
#include "opal/class/opal_list.h"
#include "opal/mca/btl/btl.h"
#include "opal/threads/mutex.h"
#include "opal/util/output.h"
#include "opal/util/proc.h"

#include <xrcbtl.h>

BEGIN_C_DECLS

/** One peer. */
struct mca_btl_base_endpoint_t {
    opal_proc_t *proc;
    uint32_t rank;
};
typedef struct mca_btl_base_endpoint_t mca_btl_base_endpoint_t;

/** What a peer needs to reach registered memory (the first
 * XRCBTL_REMOTE_MEM_SIZE bytes travel), then our own registration. */
struct mca_btl_base_registration_handle_t {
    uint8_t remote[XRCBTL_REMOTE_MEM_SIZE];
    xrcbtl_mem_t local;
};

/** A send descriptor with its buffer. */
typedef struct mca_btl_xrc_frag_t {
    mca_btl_base_descriptor_t base;
    mca_btl_base_segment_t segment;
    struct mca_btl_base_endpoint_t *endpoint;
    /* the buffer follows */
} mca_btl_xrc_frag_t;
OBJ_CLASS_DECLARATION(mca_btl_xrc_frag_t);

/** Counters: which BTL carried the traffic (printed at finalize with
 * btl_xrc_verbose >= 1). `sends` is counted under done_lock, which a send
 * takes anyway, and `received` by the receive callback, which xrcbtl never
 * runs twice at once: plain increments. The others are atomic where
 * threads are in use. */
typedef struct mca_btl_xrc_counters_t {
    int64_t sends, received;
    volatile int64_t sendi, puts, gets, atomics, registrations, add_procs;
} mca_btl_xrc_counters_t;

/** The module: one rank of xrcbtl on one device. */
typedef struct mca_btl_xrc_module_t {
    mca_btl_base_module_t super;
    xrcbtl_t *xrc;
    xrcbtl_info_t info;
    /** Endpoints by rank (vpid); grows in add_procs. */
    opal_mutex_t ep_lock;
    struct mca_btl_base_endpoint_t **eps;
    uint32_t eps_len;
    /** Send descriptors. */
    opal_free_list_t frags;
    /** Sent descriptors whose completion progress reports (ob1 expects a
     * callback for every send; see btl_xrc_frag.c). */
    opal_mutex_t done_lock;
    opal_list_t done;
    volatile int32_t done_count;
    mca_btl_base_module_error_cb_fn_t error_cb;
    mca_btl_xrc_counters_t counters;
    /** The descriptor every received message is handed in, built once:
     * xrcbtl runs receive callbacks one at a time, so one is enough, and
     * a message sets only its segment. */
    mca_btl_base_descriptor_t recv_des;
    mca_btl_base_segment_t recv_seg;
} mca_btl_xrc_module_t;

/** The component: its parameters and its (at most one) module. */
typedef struct mca_btl_xrc_component_t {
    mca_btl_base_component_3_0_0_t super;
    int verbose;
    int output;
    char *device;
    unsigned finalize_timeout_ms;
    /** btl_xrc_<setting> values, one per xrcbtl setting (xrcbtl_settings). */
    char **settings;
    const xrcbtl_setting_t *table;
    size_t table_len;
    mca_btl_xrc_module_t *module;
} mca_btl_xrc_component_t;

OPAL_MODULE_DECLSPEC extern mca_btl_xrc_component_t mca_btl_xrc_component;
extern mca_btl_xrc_module_t mca_btl_xrc_module_template;

#define XRC_VERBOSE(level, ...)                                                     \
    do {                                                                          \
        if (mca_btl_xrc_component.verbose >= (level)) {                            \
            opal_output(mca_btl_xrc_component.output, "btl:xrc: " __VA_ARGS__);    \
        }                                                                         \
    } while (0)

/** An xrcbtl status as an OPAL return code. */
int mca_btl_xrc_rc(int status);
/** Logs (btl_xrc_verbose 1) that `what` failed with an xrcbtl status,
 * and xrcbtl's message saying why. */
void mca_btl_xrc_log_failure(const char *what, int status);

/* btl_xrc_module.c */
int mca_btl_xrc_module_init(mca_btl_xrc_module_t *m);
struct mca_btl_base_endpoint_t *mca_btl_xrc_endpoint_of_rank(mca_btl_xrc_module_t *m, uint32_t rank);

/* btl_xrc_frag.c */
mca_btl_base_descriptor_t *mca_btl_xrc_alloc(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep,
                                             uint8_t order, size_t size, uint32_t flags);
int mca_btl_xrc_free(mca_btl_base_module_t *btl, mca_btl_base_descriptor_t *des);
mca_btl_base_descriptor_t *mca_btl_xrc_prepare_src(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep,
                                                   opal_convertor_t *convertor, uint8_t order,
                                                   size_t reserve, size_t *size, uint32_t flags);
int mca_btl_xrc_send(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep,
                     mca_btl_base_descriptor_t *des, mca_btl_base_tag_t tag);
int mca_btl_xrc_sendi(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep, opal_convertor_t *convertor,
                      void *header, size_t header_size, size_t payload_size, uint8_t order, uint32_t flags,
                      mca_btl_base_tag_t tag, mca_btl_base_descriptor_t **descriptor);
void mca_btl_xrc_receive(xrcbtl_t *xrc, uint32_t src, uint8_t tag, const void *data, size_t len, void *arg);
int mca_btl_xrc_complete_sends(mca_btl_xrc_module_t *m);

/* btl_xrc_rdma.c */
int mca_btl_xrc_put(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep, void *local_address,
                    uint64_t remote_address, mca_btl_base_registration_handle_t *local_handle,
                    mca_btl_base_registration_handle_t *remote_handle, size_t size, int flags, int order,
                    mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext, void *cbdata);
int mca_btl_xrc_get(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep, void *local_address,
                    uint64_t remote_address, mca_btl_base_registration_handle_t *local_handle,
                    mca_btl_base_registration_handle_t *remote_handle, size_t size, int flags, int order,
                    mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext, void *cbdata);
int mca_btl_xrc_aop(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep, uint64_t remote_address,
                    mca_btl_base_registration_handle_t *remote_handle, mca_btl_base_atomic_op_t op,
                    uint64_t operand, int flags, int order, mca_btl_base_rdma_completion_fn_t cbfunc,
                    void *cbcontext, void *cbdata);
int mca_btl_xrc_afop(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep, void *local_address,
                     uint64_t remote_address, mca_btl_base_registration_handle_t *local_handle,
                     mca_btl_base_registration_handle_t *remote_handle, mca_btl_base_atomic_op_t op,
                     uint64_t operand, int flags, int order, mca_btl_base_rdma_completion_fn_t cbfunc,
                     void *cbcontext, void *cbdata);
int mca_btl_xrc_acswap(mca_btl_base_module_t *btl, mca_btl_base_endpoint_t *ep, void *local_address,
                       uint64_t remote_address, mca_btl_base_registration_handle_t *local_handle,
                       mca_btl_base_registration_handle_t *remote_handle, uint64_t compare, uint64_t value,
                       int flags, int order, mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext,
                       void *cbdata);

END_C_DECLS

#endif /* MCA_BTL_XRC_H */
