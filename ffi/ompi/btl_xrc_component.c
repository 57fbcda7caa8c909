/*
 * mca_btl_xrc: the component. MCA parameters (btl_xrc_* mapped onto
 * xrcbtl's XRCBTL_* settings), init (one rank on one verbs device, its
 * address published through the modex), progress.
 */
#include "btl_xrc.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opal/mca/base/mca_base_var.h"
#include "opal/mca/btl/base/base.h"
#include "opal/mca/pmix/pmix.h"
#include "opal/util/proc.h"

static int xrc_register(void);
static int xrc_open(void);
static int xrc_close(void);
/* Whether btl_xrc_flags was set (command line, environment or a file)
 * rather than left at the template's value. */
static bool flags_given(void)
{
    mca_base_var_source_t source = MCA_BASE_VAR_SOURCE_DEFAULT;
    int vari = mca_base_var_find("opal", "btl", "xrc", "flags");
    return vari >= 0 && OPAL_SUCCESS == mca_base_var_get_value(vari, NULL, &source, NULL) &&
           MCA_BASE_VAR_SOURCE_DEFAULT != source;
}

static mca_btl_base_module_t **xrc_init(int *num_btls, bool progress_threads, bool mpi_threads);
static int xrc_progress(void);

mca_btl_xrc_component_t mca_btl_xrc_component = {
    .super = {
        .btl_version = {
            MCA_BTL_DEFAULT_VERSION("xrc"),
            .mca_open_component = xrc_open,
            .mca_close_component = xrc_close,
            .mca_register_component_params = xrc_register,
        },
        .btl_data = {
            .param_field = MCA_BASE_METADATA_PARAM_NONE,
        },
        .btl_init = xrc_init,
        .btl_progress = xrc_progress,
    },
};

/* Storage of the btl_xrc_<setting> variables: static, because the MCA
 * variable system writes into it until the component is unloaded. */
#define XRC_MAX_SETTINGS 64
static char *setting_values[XRC_MAX_SETTINGS];
static char setting_names[XRC_MAX_SETTINGS][64];
static char setting_help[XRC_MAX_SETTINGS][512];
static char *device_param;

/* xrcbtl's eager limit is not a parameter of its own: ob1's eager_limit,
 * max_send_size and rndv_eager_limit (registered by the BTL base) decide
 * the largest message, and so the size of xrcbtl's receive buffers. */
static int is_eager_limit(const char *setting)
{
    return 0 == strcmp(setting, "XRCBTL_EAGER_LIMIT");
}

static int xrc_register(void)
{
    mca_btl_xrc_component_t *c = &mca_btl_xrc_component;
    mca_base_component_t *v = &c->super.btl_version;

    c->verbose = 0;
    (void) mca_base_component_var_register(v, "verbose",
                                           "Verbosity of the xrc BTL (0: errors only, 1: set-up, what xrcbtl "
                                           "refused (registrations, puts, gets, atomics) and why, and the counters "
                                           "of what it carried, printed at finalize, 2: every peer)",
                                           MCA_BASE_VAR_TYPE_INT, NULL, 0, 0, OPAL_INFO_LVL_5,
                                           MCA_BASE_VAR_SCOPE_LOCAL, &c->verbose);
    device_param = "";
    (void) mca_base_component_var_register(v, "device",
                                           "Verbs device to use (empty: of those with an IPv4 address on their "
                                           "interface, the nearest to the rank's CPUs, from hwloc)",
                                           MCA_BASE_VAR_TYPE_STRING, NULL, 0, 0, OPAL_INFO_LVL_3,
                                           MCA_BASE_VAR_SCOPE_READONLY, &device_param);
    c->finalize_timeout_ms = 5000;
    (void) mca_base_component_var_register(v, "finalize_timeout",
                                           "Milliseconds finalize waits for peers to confirm this rank's clean "
                                           "departure before it releases everything anyway",
                                           MCA_BASE_VAR_TYPE_UNSIGNED_INT, NULL, 0, 0, OPAL_INFO_LVL_6,
                                           MCA_BASE_VAR_SCOPE_READONLY, &c->finalize_timeout_ms);

    /* One variable per xrcbtl setting: XRCBTL_SRQ_DEPTH is btl_xrc_srq_depth. */
    c->table_len = xrcbtl_settings(&c->table);
    if (c->table_len > XRC_MAX_SETTINGS) {
        c->table_len = XRC_MAX_SETTINGS;
    }
    c->settings = setting_values;
    for (size_t i = 0; i < c->table_len; i++) {
        const char *name = c->table[i].name + strlen("XRCBTL_");
        size_t k;
        if (is_eager_limit(c->table[i].name)) {
            continue;
        }
        for (k = 0; name[k] && k + 1 < sizeof setting_names[i]; k++) {
            setting_names[i][k] = (char) tolower((unsigned char) name[k]);
        }
        setting_names[i][k] = '\0';
        snprintf(setting_help[i], sizeof setting_help[i], "%s (xrcbtl's %s)", c->table[i].help,
                 c->table[i].name);
        setting_values[i] = (char *) c->table[i].default_value;
        (void) mca_base_component_var_register(v, setting_names[i], setting_help[i], MCA_BASE_VAR_TYPE_STRING,
                                               NULL, 0, 0, OPAL_INFO_LVL_5, MCA_BASE_VAR_SCOPE_READONLY,
                                               &setting_values[i]);
    }

    /* The limits, ranking and flags the BTL base registers (btl_xrc_eager_limit,
     * btl_xrc_exclusivity, ...), with our defaults from the template. */
    return mca_btl_base_param_register(v, &mca_btl_xrc_module_template.super);
}

static int xrc_open(void)
{
    mca_btl_xrc_component.output = opal_output_open(NULL);
    opal_output_set_verbosity(mca_btl_xrc_component.output, mca_btl_xrc_component.verbose);
    mca_btl_xrc_component.module = NULL;
    return OPAL_SUCCESS;
}

static int xrc_close(void)
{
    /* Finalize released the module, and with it every verbs object and
     * xrcbtl's threads. */
    opal_output_close(mca_btl_xrc_component.output);
    return OPAL_SUCCESS;
}

int mca_btl_xrc_rc(int status)
{
    switch (status) {
    case XRCBTL_OK: return OPAL_SUCCESS;
    case XRCBTL_ERR_AGAIN: return OPAL_ERR_OUT_OF_RESOURCE;
    case XRCBTL_ERR_UNREACHABLE:
    case XRCBTL_ERR_CLOSED:
    case XRCBTL_ERR_STATE: return OPAL_ERR_UNREACH;
    case XRCBTL_ERR_UNSUPPORTED: return OPAL_ERR_NOT_SUPPORTED;
    case XRCBTL_ERR_INVALID: return OPAL_ERR_BAD_PARAM;
    case XRCBTL_ERR_NOT_FOUND: return OPAL_ERR_NOT_FOUND;
    case XRCBTL_ERR_TIMEOUT: return OPAL_ERR_TIMEOUT;
    default: return OPAL_ERROR;
    }
}

void mca_btl_xrc_log_failure(const char *what, int status)
{
    char msg[512];
    xrcbtl_last_error(msg, sizeof msg);
    XRC_VERBOSE(1, "%s: %s (%s)", what, xrcbtl_strerror(status), msg);
}

static mca_btl_base_module_t **xrc_init(int *num_btls, bool progress_threads, bool mpi_threads)
{
    mca_btl_xrc_component_t *c = &mca_btl_xrc_component;
    mca_btl_xrc_module_t *m;
    mca_btl_base_module_t **modules;
    const char *settings[XRC_MAX_SETTINGS + 2];
    char eager[64], job[64];
    size_t n = 0, limit;
    uint8_t addr[XRCBTL_ADDRESS_MAX];
    size_t addr_len = sizeof addr;
    xrcbtl_params_t p;
    int rc;

    (void) progress_threads; /* always true from ob1; xrcbtl starts no thread */
    *num_btls = 0;
    if (xrcbtl_abi_version() != XRCBTL_ABI_VERSION) {
        XRC_VERBOSE(1, "libxrcbtl implements ABI %u, the component was built for %u", xrcbtl_abi_version(),
                    (unsigned) XRCBTL_ABI_VERSION);
        return NULL;
    }
    m = malloc(sizeof *m);
    if (NULL == m) {
        return NULL;
    }
    *m = mca_btl_xrc_module_template;

    /* Settings given as btl_xrc_* (where they differ from xrcbtl's
     * defaults, so that XRCBTL_* environment variables still apply), and
     * the eager limit ob1's limits need. */
    for (size_t i = 0; i < c->table_len; i++) {
        static char buf[XRC_MAX_SETTINGS][320];
        if (is_eager_limit(c->table[i].name) || NULL == setting_values[i] ||
            0 == strcmp(setting_values[i], c->table[i].default_value)) {
            continue;
        }
        snprintf(buf[i], sizeof buf[i], "%s=%s", c->table[i].name, setting_values[i]);
        settings[n++] = buf[i];
    }
    limit = m->super.btl_eager_limit;
    if (m->super.btl_max_send_size > limit) limit = m->super.btl_max_send_size;
    if (m->super.btl_rndv_eager_limit > limit) limit = m->super.btl_rndv_eager_limit;
    snprintf(eager, sizeof eager, "XRCBTL_EAGER_LIMIT=%zu", limit);
    settings[n++] = eager;
    settings[n] = NULL;

    /* The ranks of one job on one node share an XRC domain named after it. */
    snprintf(job, sizeof job, "ompi-%x", (unsigned) OPAL_PROC_MY_NAME.jobid);
    memset(&p, 0, sizeof p);
    p.field_mask = XRCBTL_PARAM_RANK | XRCBTL_PARAM_JOB | XRCBTL_PARAM_SETTINGS;
    p.rank = OPAL_PROC_MY_NAME.vpid;
    p.job = job;
    p.settings = settings;
    if (NULL != device_param && '\0' != device_param[0]) {
        p.field_mask |= XRCBTL_PARAM_DEVICE;
        p.device = device_param;
    }
    rc = xrcbtl_create(&p, &m->xrc);
    if (XRCBTL_OK != rc) {
        mca_btl_xrc_log_failure("no module (xrcbtl_create)", rc);
        free(m);
        return NULL;
    }
    (void) xrcbtl_query(m->xrc, &m->info);

    /* ob1's messages must fit what xrcbtl sends eagerly. */
    if (m->super.btl_eager_limit > m->info.max_send_size) m->super.btl_eager_limit = m->info.max_send_size;
    if (m->super.btl_max_send_size > m->info.max_send_size) m->super.btl_max_send_size = m->info.max_send_size;
    if (m->super.btl_rndv_eager_limit > m->super.btl_eager_limit) {
        m->super.btl_rndv_eager_limit = m->super.btl_eager_limit;
    }
    if (m->super.btl_get_limit > m->info.max_rma) m->super.btl_get_limit = m->info.max_rma;
    if (m->super.btl_put_limit > m->info.max_rma) m->super.btl_put_limit = m->info.max_rma;
    if (!(m->info.flags & XRCBTL_INFO_ATOMICS)) {
        /* osc/rdma then looks elsewhere (or use --mca osc pt2pt). */
        m->super.btl_flags &= ~(MCA_BTL_FLAGS_ATOMIC_OPS | MCA_BTL_FLAGS_ATOMIC_FOPS);
        m->super.btl_atomic_flags = 0;
    }
    if ((m->info.flags & XRCBTL_INFO_PREFERS_PUT) && !flags_given()) {
        /* Where xrcbtl's own rendezvous writes (iWARP), ob1's should too:
         * with GET offered it reads every large message (RGET), and soft-iWARP
         * serves reads from a kernel thread. Measured on siw across two
         * nodes, osu_bw at 16 MiB: 24.6 MB/s by RGET, 50.5 by ob1's put
         * pipeline. A btl_xrc_flags the user gives is kept as given. */
        m->super.btl_flags &= ~MCA_BTL_FLAGS_GET;
    }

    rc = mca_btl_xrc_module_init(m);
    if (OPAL_SUCCESS != rc) {
        (void) xrcbtl_destroy(m->xrc);
        free(m);
        return NULL;
    }

    rc = xrcbtl_address(m->xrc, addr, &addr_len);
    if (XRCBTL_OK != rc) {
        mca_btl_xrc_log_failure("xrcbtl_address", rc);
        m->super.btl_finalize(&m->super);
        return NULL;
    }
    OPAL_MODEX_SEND(rc, OPAL_PMIX_GLOBAL, &c->super.btl_version, addr, addr_len);
    if (OPAL_SUCCESS != rc) {
        XRC_VERBOSE(1, "modex send failed: %d", rc);
        m->super.btl_finalize(&m->super);
        return NULL;
    }
    modules = malloc(sizeof *modules);
    if (NULL == modules) {
        m->super.btl_finalize(&m->super);
        return NULL;
    }
    modules[0] = &m->super;
    *num_btls = 1;
    c->module = m;
    /* A device whose regions are bounded (rxe: 1 GiB - 4 KiB) says so: a
     * larger registration fails and ob1 pipelines instead. */
    char regs[64] = "";
    if (m->info.max_registration < ((uint64_t) 1 << 48))
        snprintf(regs, sizeof regs, ", registrations up to %" PRIu64 " bytes", m->info.max_registration);
    XRC_VERBOSE(1, "rank %u on %s (%s%s%s), eager limit %zu, max send %zu%s, mpi threads %d", p.rank,
                m->info.device, XRCBTL_MODE_XRC == m->info.mode ? "XRC" : "RC",
                (m->info.flags & XRCBTL_INFO_ATOMICS) ? ", atomics" : "",
                (m->super.btl_flags & MCA_BTL_FLAGS_GET) ? ", get" : ", no get: ob1 puts", m->super.btl_eager_limit,
                m->super.btl_max_send_size, regs, (int) mpi_threads);
    return modules;
}

/* Any thread may call this, several at once: xrcbtl_progress is thread-safe
 * and runs callbacks one at a time, outside its locks. */
static int xrc_progress(void)
{
    mca_btl_xrc_module_t *m = mca_btl_xrc_component.module;
    int n;

    if (NULL == m) {
        return 0;
    }
    n = xrcbtl_progress(m->xrc);
    if (n < 0) {
        n = 0;
    }
    if (m->done_count > 0) {
        n += mca_btl_xrc_complete_sends(m);
    }
    return n;
}
