/* The rdma-core headers the verbs provider binds; bindgen reads this file
 * and compiles wrappers for its static inline functions. */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <infiniband/ib.h>
#include <fcntl.h>
