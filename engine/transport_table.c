/* Every transport compiled in, in preference order (lower preference value
 * first is re-established by the engine; this order breaks ties). */
#include "transport.h"

extern const struct xfer_transport_ops xfer_tcp_transport_ops;
extern const struct xfer_transport_ops xfer_ipc_transport_ops;
extern const struct xfer_transport_ops xfer_rdma_transport_ops;
extern const struct xfer_transport_ops xfer_tcpx_transport_ops;

const struct xfer_transport_ops *const xfer_transport_table[] = {
    &xfer_ipc_transport_ops,
    &xfer_rdma_transport_ops,
    &xfer_tcpx_transport_ops,
    &xfer_tcp_transport_ops,
    NULL,
};
