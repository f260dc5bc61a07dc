/*
 * The owner's end of a connection's message ring (ipc_ring.h, docs/ipc.md
 * "Message ring"): setting it up when the initiator asks (IPC_RING_REQ)
 * and serving the frames waiting in it, under rx_mu, by whoever reads the
 * connection (its serving thread woken by an IPC_RING_BELL, or a message
 * waiter, ipc_serve_rx.c). A frame is handed to the engine exactly as an
 * IPC_MSG_REQ read from the socket (the same xfer_engine_msg_recv, so the
 * same checks, queue, back-pressure and answers); its answer goes into the
 * answer ring.
 */
#include "ipc_serve.h"
#include "xfer_io.h"

#include <time.h>
#include <unistd.h>

static int io_timeout(const struct serve_conn *c)
{
    return xfer_engine_config_get(c->srv->engine)->io_timeout_ms;
}

int ipc_serve_ring_setup(struct serve_conn *c, int fd)
{
    int32_t st = -XFER_ENOTSUP;
    if (c->srv->ring_ok && !c->ring_up && fd >= 0)
        st = ipc_ring_attach(&c->ring, fd);
    if (fd >= 0)
        close(fd);
    int efd = st == 0 ? ipc_ring_make_efd(&c->ring) : -1; /* its waiters sleep on it */
    if (st == 0)
        __atomic_store_n(&c->ring_up, true, __ATOMIC_RELEASE);
    else
        xfer_debug("ipc: no message ring with %s: %s", c->peer_node, xfer_strerror(st));
    return ipc_send(c->fd, IPC_RING_RESP, 1, &st, sizeof(st), efd, io_timeout(c));
}

/* rx_mu held: puts st in the answer ring, waiting while it is full (the
 * initiator reads its answers; a full ring past io_timeout_ms or a peer
 * that hung up ends the connection, as a send that cannot go out would). */
static int answer(struct serve_conn *c, int32_t st)
{
    int64_t end = xfer_now_ms() + io_timeout(c);
    for (;;) {
        int rc = ipc_ring_answer(&c->ring, st);
        if (rc != -XFER_EBUSY)
            return rc;
        if (xfer_now_ms() > end || ipc_sock_hung_up(c->fd))
            return -XFER_ECONN;
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
}

int ipc_serve_ring(struct serve_conn *c)
{
    if (!c->ring_up)
        return 0;
    uint32_t max = c->buf_max < XFER_MSG_FRAME_MAX ? (uint32_t)c->buf_max : XFER_MSG_FRAME_MAX;
    for (;;) {
        uint32_t len = 0;
        int rc = ipc_ring_get(&c->ring, c->buf, max, &len);
        if (rc == 0)
            return 0; /* drained */
        if (rc == 1) {
            int32_t st =
                xfer_engine_msg_recv(c->srv->engine, c->peer_node, c->peer_inc, c->buf, len);
            rc = answer(c, st);
        }
        if (rc == -XFER_EPROTO)
            xfer_warn("ipc: corrupt message ring from peer %s, closing", c->peer_node);
        if (rc < 0)
            return rc;
    }
}
