/*
 * The initiator's unix socket, shared by the connection's worker (MAP, ACQ,
 * REL) and by whoever sends an engine message (docs/notify.md, "ipc").
 *
 * Why: an engine message used to be queued to the worker, which did the
 * round trip and completed it: two thread hand-offs per message (the
 * submitter wakes the worker, the worker wakes the waiter). Now the thread
 * that calls send_msg (a submitter at the end of its direct section, or the
 * engine's message thread) writes the MSG_REQ itself and reads the answer
 * itself, which the owner's serving thread sends within microseconds.
 *
 * Rules. One exchange at a time holds the link (c->link_mu): its request and
 * the reading of answers. The owner's serving thread answers requests in
 * order, so a message whose answer is not read yet is kept on c->owed and
 * whoever takes the link next reads owed answers first (before the answer
 * to its own request). A sender waits for its answer at most
 * IPC_MSG_WAIT_MS (a stopped or busy owner); past that, the worker reads
 * the owed answers (at most io_timeout_ms, then the connection is broken as
 * for any round trip). A sender that finds the link taken (the worker in a
 * round trip) or messages queued for the worker queues its message behind
 * them: messages to a peer keep their order and submit never waits for the
 * worker's round trip. Completions (xfer_msg_done) run after the link is
 * let go: they may end batches.
 */
#include "ipc_conn.h"
#include "xfer_io.h"
#include "mono_clock.h"

#include <poll.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* How long a sender waits for its own answer before leaving it to the
 * worker; an owner answers at once unless stopped or starved of CPU. */
#define IPC_MSG_WAIT_MS 20

/* How long one sleep for an answer in the ring lasts before the socket is
 * looked at for a hang-up (the owner died: no answer will come). */
#define RING_WAIT_SLICE_US 10000

/* link_mu held: the next answer from the ring, waiting at most wait_ms
 * (spinning ring_spin_us first, then asleep on the ring's futex). */
static int ring_answer(struct ipc_conn *c, int wait_ms, int32_t *ans)
{
    int64_t now = xfer_mono_ns(), end = now + (int64_t)wait_ms * 1000000;
    int64_t spin_end = now + (int64_t)c->ring_spin_us * 1000;
    bool slept = false;
    for (;;) {
        int got = ipc_ring_take_answer(&c->ring, ans);
        if (got != 0)
            return got < 0 ? got : 0;
        now = xfer_mono_ns();
        if (now >= end)
            return -XFER_ETIMEDOUT;
        if (now < spin_end) {
            __builtin_ia32_pause();
            continue;
        }
        if (slept && ipc_sock_hung_up(c->fd)) /* answers it gave before are in the ring */
            return ipc_ring_take_answer(&c->ring, ans) == 1 ? 0 : -XFER_ECONN;
        int64_t left_us = (end - now) / 1000 + 1;
        ipc_ring_wait_answer(&c->ring, left_us < RING_WAIT_SLICE_US ? left_us : RING_WAIT_SLICE_US);
        slept = true;
    }
}

/* link_mu held: reads the answer owed to the oldest message, waiting at
 * most wait_ms for it to start arriving (-XFER_ETIMEDOUT: nothing read);
 * the message moves to c->answered. Any other failure breaks the link. */
static int read_answer(struct ipc_conn *c, int wait_ms)
{
    struct ipc_hdr h = {.type = IPC_MSG_RESP};
    int32_t ans = -XFER_ECONN;
    int rc;
    if (c->ring_up) {
        rc = ring_answer(c, wait_ms, &ans);
    } else {
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        int n = poll(&p, 1, wait_ms);
        if (n == 0)
            return -XFER_ETIMEDOUT;
        rc = n < 0 ? -XFER_ECONN : ipc_recv_fixed(c->fd, &h, &ans, sizeof(ans), c->io_timeout_ms);
    }
    if (rc == 0 &&
        (h.type != IPC_MSG_RESP || (ans > 0 && ans != XFER_MSG_DELIVERED) || ans <= -XFER_ERR_MAX))
        rc = -XFER_EPROTO;
    if (rc == -XFER_EPROTO && c->ring_up)
        xfer_warn("ipc: corrupt answer ring from the owner, closing the connection");
    if (rc < 0)
        return rc;
    struct ipc_msgq *q = c->owed;
    c->owed = q->next;
    if (!c->owed)
        c->owed_tail = NULL;
    q->status = ans;
    q->next = c->answered;
    c->answered = q;
    return 0;
}

/* link_mu held: every message still owed an answer fails (-XFER_ECONN: may
 * or may not have arrived) and the link refuses new ones. */
static void link_break(struct ipc_conn *c)
{
    c->link_broken = true;
    __atomic_store_n(&c->broken, true, __ATOMIC_RELAXED); /* ipc_conn_state */
    while (c->owed) {
        struct ipc_msgq *q = c->owed;
        c->owed = q->next;
        q->status = -XFER_ECONN;
        q->next = c->answered;
        c->answered = q;
    }
    c->owed_tail = NULL;
}

/* link_mu held: reads owed answers until none is owed (wait_ms for each)
 * or until `until` has been answered. */
static int read_owed(struct ipc_conn *c, const struct ipc_msgq *until, int wait_ms)
{
    int64_t end = xfer_now_ms() + wait_ms;
    while (c->owed && !c->link_broken) {
        bool last = c->owed == until;
        int64_t left = end - xfer_now_ms();
        int rc = read_answer(c, left > 0 ? (int)left : 0);
        if (rc == -XFER_ETIMEDOUT)
            return rc;
        if (rc < 0) {
            link_break(c);
            return -XFER_ECONN;
        }
        if (last)
            return 0;
        end = xfer_now_ms() + wait_ms;
    }
    return c->link_broken ? -XFER_ECONN : 0;
}

int ipc_link_lock(struct ipc_conn *c, bool drain)
{
    pthread_mutex_lock(&c->link_mu);
    if (drain)
        read_owed(c, NULL, c->io_timeout_ms);
    if (c->owed && drain) /* not answered within io_timeout: as a failed round trip */
        link_break(c);
    return c->link_broken ? -XFER_ECONN : 0;
}

/* Completes the answered messages, oldest first; no lock held. */
static void complete(struct ipc_msgq *q)
{
    struct ipc_msgq *rev = NULL;
    while (q) { /* c->answered is newest first */
        struct ipc_msgq *next = q->next;
        q->next = rev;
        rev = q;
        q = next;
    }
    while (rev) {
        struct ipc_msgq *next = rev->next;
        xfer_msg_done(rev->m, rev->status, /* rev (in m->tp) goes with m */
                      rev->status == -XFER_ECONN ? "ipc connection to the owner lost" : NULL);
        rev = next;
    }
}

void ipc_link_unlock(struct ipc_conn *c, int rc)
{
    if (rc < 0 && !c->link_broken)
        link_break(c);
    struct ipc_msgq *done = c->answered;
    c->answered = NULL;
    pthread_mutex_unlock(&c->link_mu);
    complete(done);
}

/* link_mu held: puts a frame in the ring (waiting while it is full: the
 * owner drains it; answers that came meanwhile are read, so that an owner
 * waiting for room for them does not wait on us) and wakes the owner's
 * readers when they may sleep (the bell, or the waiters' eventfd). */
static int ring_send(struct ipc_conn *c, const void *frame, uint32_t len)
{
    int64_t end = xfer_now_ms() + c->io_timeout_ms;
    int rc;
    while ((rc = ipc_ring_put(&c->ring, frame, len)) == -XFER_EBUSY) {
        if (xfer_now_ms() > end || ipc_sock_hung_up(c->fd))
            return -XFER_ECONN;
        int got = 0;
        while (c->owed && (got = read_answer(c, 0)) == 0)
            ;
        if (got < 0 && got != -XFER_ETIMEDOUT)
            return got; /* a corrupt answer ring, or the owner gone */
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    if (rc == 0)
        rc = ipc_ring_ring(&c->ring, ipc_ring_need_bell(&c->ring), c->fd, c->io_timeout_ms);
    if (rc == -XFER_EPROTO)
        xfer_warn("ipc: corrupt message ring (the owner's read index), closing the connection");
    return rc;
}

/* link_mu held: sends q's frame and keeps it owed an answer. */
static int link_send(struct ipc_conn *c, struct ipc_msgq *q)
{
    if (c->link_broken)
        return -XFER_ECONN;
    int rc = c->ring_up ? ring_send(c, q->m->frame, (uint32_t)q->m->len)
                        : ipc_send(c->fd, IPC_MSG_REQ, 1, q->m->frame, (uint32_t)q->m->len, -1,
                                   c->io_timeout_ms);
    if (rc < 0) {
        link_break(c);
        return rc;
    }
    q->next = NULL;
    q->sent_ms = xfer_now_ms();
    if (c->owed_tail)
        c->owed_tail->next = q;
    else
        c->owed = q;
    c->owed_tail = q;
    return 0;
}

/* The worker reads what is owed now (link_mu held). */
static void owed_to_worker(struct ipc_conn *c)
{
    pthread_mutex_lock(&c->mu);
    c->owed_wake = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* link_mu held: answers nobody waits for are owed; the next user of the
 * link reads them, else the worker after IPC_OWED_LAZY_MS. */
static void owed_lazy(struct ipc_conn *c)
{
    pthread_mutex_lock(&c->mu);
    if (!c->owed_lazy_ms) {
        c->owed_lazy_ms = xfer_now_ms();
        pthread_cond_signal(&c->cv); /* it sleeps shorter from now on */
    }
    pthread_mutex_unlock(&c->mu);
}

void ipc_link_lazy(struct ipc_conn *c)
{
    bool left = true; /* the link is busy: look again later */
    if (pthread_mutex_trylock(&c->link_mu) == 0) {
        read_owed(c, NULL, 0); /* those that arrived */
        if (c->owed && xfer_now_ms() - c->owed->sent_ms > c->io_timeout_ms)
            link_break(c); /* not answered within io_timeout: as a failed round trip */
        left = c->owed != NULL;
        ipc_link_unlock(c, 0);
    }
    if (left)
        owed_lazy(c);
}

void ipc_link_worker_msgs(struct ipc_conn *c)
{
    int rc = ipc_link_lock(c, true);
    pthread_mutex_lock(&c->mu);
    struct ipc_msgq *q = c->mhead;
    c->mhead = c->mtail = NULL;
    c->owed_wake = false;
    pthread_mutex_unlock(&c->mu);
    while (q) { /* sent one after the other, answers read after */
        struct ipc_msgq *next = q->next;
        if (rc == 0)
            rc = link_send(c, q);
        if (rc < 0) { /* not sent: fails with the rest */
            q->status = -XFER_ECONN;
            q->next = c->answered;
            c->answered = q;
        }
        q = next;
    }
    if (rc == 0 && read_owed(c, NULL, c->io_timeout_ms) < 0)
        rc = -XFER_ECONN; /* not answered within io_timeout: as a failed round trip */
    ipc_link_unlock(c, rc);
}

int ipc_conn_send_msg(struct xfer_conn *xc, struct xfer_msg *m)
{
    struct ipc_conn *c = container_of(xc, struct ipc_conn, base);
    if (m->len > XFER_MSG_FRAME_MAX)
        return -XFER_EINVAL;
    struct ipc_msgq *q = (struct ipc_msgq *)m->tp; /* m's own room: no allocation */
    *q = (struct ipc_msgq){.m = m};
    bool mine = pthread_mutex_trylock(&c->link_mu) == 0;
    pthread_mutex_lock(&c->mu);
    bool dead = c->broken || c->stop || (mine && c->link_broken);
    bool queue = !dead && (!mine || c->mhead); /* behind the worker's round trip or queue */
    if (queue) {
        if (c->mtail)
            c->mtail->next = q;
        else
            c->mhead = q;
        c->mtail = q;
        pthread_cond_signal(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    if (dead || queue) {
        if (mine)
            pthread_mutex_unlock(&c->link_mu);
        return dead ? -XFER_ECONN : 0;
    }
    bool lazy = m->lazy;
    int rc = link_send(c, q); /* from here on m is the link's */
    if (rc < 0) {             /* the link broke: m completes with the owed ones */
        q->status = -XFER_ECONN;
        q->next = c->answered;
        c->answered = q;
    } else if (lazy) { /* the caller goes on: answers that came are read, the rest later */
        if (read_owed(c, NULL, 0) == -XFER_ETIMEDOUT)
            owed_lazy(c);
    } else if (read_owed(c, q, IPC_MSG_WAIT_MS) == -XFER_ETIMEDOUT) {
        owed_to_worker(c);
    }
    ipc_link_unlock(c, 0);
    return 0;
}

void ipc_link_fini(struct ipc_conn *c)
{
    pthread_mutex_lock(&c->link_mu);
    link_break(c);
    ipc_link_unlock(c, 0);
}

int ipc_link_ring_setup(struct ipc_conn *c, uint32_t flags, int timeout_ms)
{
    if (!(flags & IPC_HELLO_RING) || !ipc_ring_enabled())
        return 0; /* a peer without it, or off here: the socket carries messages */
    int fd = -1;
    if (ipc_ring_create(&c->ring, &fd) < 0)
        return 0;
    struct ipc_hdr h;
    int32_t st = -XFER_ECONN;
    int efd = -1; /* the owner's waiters' eventfd (an owner built before: none) */
    int rc = ipc_send(c->fd, IPC_RING_REQ, 0, NULL, 0, fd, timeout_ms);
    close(fd);
    if (rc == 0)
        rc = ipc_recv(c->fd, &h, &st, sizeof(st), &efd, timeout_ms);
    if (rc == 0)
        rc = ipc_msg_check(&h, &st, IPC_RING_RESP, 1);
    c->ring_up = rc == 0 && st == 0;
    if (c->ring_up && efd >= 0) {
        c->ring.efd = efd;
        c->ring.efd_up = true;
    } else if (efd >= 0) {
        close(efd);
    }
    if (!c->ring_up)
        ipc_ring_unmap(&c->ring);
    c->ring_spin_us = xfer_engine_config_get(c->t->base.engine)->busy_poll_us;
    return rc;
}
