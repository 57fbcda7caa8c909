/* The libfabric headers the provider is built against (Debian 12's
 * libfabric-dev 1.17), for bindgen (ofi/build.rs). */
#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <rdma/providers/fi_prov.h>
#include <rdma/providers/fi_log.h>
