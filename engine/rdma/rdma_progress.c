/* rdma: progress threads. Each owns one CQ per local NIC (with a completion
 * channel) and maps completions back to chunks through the wr_id: QP slot,
 * slot incarnation and sequence number. */
#include "rdma.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define POLL_BATCH 32

/* Full sequence number from the 40 bits of a wr_id: the in-flight window
 * is far below 2^40, so the oldest chunk in the ring anchors it. */
static uint64_t full_seq(const struct rdma_slot *s, uint64_t s40)
{
    uint64_t base = s->ring.n ? s->ring.v[s->ring.head].seq : s->next_seq;
    return base + ((s40 - (base & RDMA_SEQ_MASK)) & RDMA_SEQ_MASK);
}

/* A chunk through a lease window the owner's NIC refused: the window was
 * invalidated (lease ended, blocks released) or belonged to a QP since
 * re-established. It asks for a new window once (the owner's rules decide);
 * refused again by the NIC, the item fails as the owner's refusal. A chunk
 * whose QP died under it (-XFER_ECONN, not flushed: e.g. the owner's side
 * went to error when a bind failed on it, which takes its windows along) is
 * re-queued too: it asks for a window on the QP it gets next (the
 * re-established one). Each QP that dies under it counts, WIN_QP_LOST_MAX
 * at most (two churns close together may catch one chunk twice); a peer
 * really gone fails it -XFER_ECONN when its reconnection fails. */
#define WIN_QP_LOST_MAX 4
static void window_refused(struct xfer_rdma_chunk *ch)
{
    if (ch->win && ch->status == -XFER_ECONN && !ch->retryable &&
        ch->win_qp_lost < WIN_QP_LOST_MAX) {
        xfer_info("rdma: a QP died under a lease window (%s): asking for a new one",
                  ch->why ? ch->why : "connection lost");
        ch->win_qp_lost++;
        ch->retryable = true;
        return;
    }
    if (!ch->win || ch->status != -XFER_EACCES)
        return;
    if (!ch->win_refused) {
        xfer_info("rdma: the owner's NIC refused a lease window (lease ended, blocks released or "
                  "QP re-established): asking for a new one");
        ch->win_refused = true;
        ch->retryable = true;
        return;
    }
    ch->status = -XFER_ESTALE;
    ch->why = "refused by the owner's NIC: the lease window was invalidated (lease ended or "
              "blocks released)";
}

static void finish_all(struct rdma_conn *c, struct xfer_rdma_chunk *done, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct xfer_rdma_chunk *ch = &done[i];
        if (ch->drain) /* the marker behind a broken QP's last WRs: no chunk */
            continue;
        window_refused(ch);
        if (ch->msg) {
            xrdma_msg_sent(ch);
        } else if (ch->retryable) {
            xfer_batch_io_end(ch->b, ch->item); /* the NIC let go of it */
            xrdma_chunk_retry_or_fail(c, ch);
        } else {
            xrdma_chunk_finish(ch, true);
        }
    }
}

static void handle_wc(struct rdma_transport *t, const struct ibv_wc *wc,
                      struct xfer_rdma_chunk *done)
{
    uint32_t idx = (uint32_t)(wc->wr_id >> 52);
    uint16_t uid = (uint16_t)((wc->wr_id >> RDMA_SEQ_BITS) & 0xfff);
    if (idx >= RDMA_MAX_SLOTS)
        return;
    struct rdma_slot *s = &t->slots[idx];
    pthread_mutex_lock(&s->lock);
    if (s->state == SLOT_FREE || (s->uid & 0xfff) != uid || !s->conn) {
        pthread_mutex_unlock(&s->lock); /* a CQE of a QP already torn down */
        return;
    }
    uint64_t seq = full_seq(s, wc->wr_id & RDMA_SEQ_MASK);
    size_t n = xfer_rdma_ring_complete(&s->ring, seq, wc->status, done, s->depth);
    bool kick = false;
    if (wc->status != IBV_WC_SUCCESS) {
        if (s->state == SLOT_READY)
            xfer_warn("rdma: QP %u to %s (%s → %s): %s; re-establishing", s->index,
                      s->conn->peer.node_id, t->nics[s->lnic].desc.name,
                      s->conn->rnics[s->rnic].name, ibv_wc_status_str(wc->status));
        if (s->state == SLOT_READY || s->state == SLOT_CONNECTING)
            s->state = SLOT_ERROR;
    }
    if (s->state == SLOT_ERROR && s->ring.n == 0) {
        s->state = SLOT_DEAD;
        kick = true;
    }
    /* Keeps c alive past the slot lock (teardown waits for refs == 0); the
     * lock order is conn then slot, so no conn lock here. */
    struct rdma_conn *c = s->conn;
    __atomic_add_fetch(&c->refs, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_unlock(&s->lock);
    finish_all(c, done, n);
    pthread_mutex_lock(&c->lock);
    if (!c->closing)
        xrdma_pump_locked(c);
    if (__atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) == 0)
        pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    if (kick)
        xrdma_cm_kick(t);
}

static void drain_cq(struct rdma_transport *t, struct ibv_cq *cq, struct xfer_rdma_chunk *done)
{
    struct ibv_wc wc[POLL_BATCH];
    for (;;) {
        int n = ibv_poll_cq(cq, POLL_BATCH, wc);
        if (n < 0) {
            xfer_err("rdma: ibv_poll_cq: %d (completion queue overrun?)", n);
            return;
        }
        for (int i = 0; i < n; i++)
            handle_wc(t, &wc[i], done);
        if (n < POLL_BATCH)
            return;
    }
}

/* The NICs' message CQs (progress thread 0): requests, answers, sends. */
static void drain_msg_cq(struct rdma_transport *t, struct ibv_cq *cq)
{
    struct ibv_wc wc[POLL_BATCH];
    for (;;) {
        int n = ibv_poll_cq(cq, POLL_BATCH, wc);
        if (n < 0) {
            xfer_err("rdma: ibv_poll_cq (messages): %d", n);
            return;
        }
        for (int i = 0; i < n; i++)
            xrdma_msg_cqe(t, &wc[i]);
        if (n < POLL_BATCH)
            return;
    }
}

static void *progress_main(void *arg)
{
    struct rdma_progress *p = arg;
    struct rdma_transport *t = p->t;
    int n = t->n_nics, nm = p->index == 0 ? n : 0; /* thread 0 also serves messages */
    struct xfer_rdma_chunk *done = calloc(t->sq_depth, sizeof(*done));
    struct pollfd fds[2 * XFER_RDMA_MAX_NICS + 1];
    for (int i = 0; i < n; i++)
        fds[i] = (struct pollfd){.fd = p->ch[i]->fd, .events = POLLIN};
    for (int i = 0; i < nm; i++)
        fds[n + i] = (struct pollfd){.fd = t->nics[i].msg_ch->fd, .events = POLLIN};
    fds[n + nm] = (struct pollfd){.fd = p->wake_fd, .events = POLLIN};
    while (done && !__atomic_load_n(&t->stopping, __ATOMIC_ACQUIRE)) {
        int r = poll(fds, (nfds_t)(n + nm) + 1, 200);
        if (r < 0 && errno != EINTR)
            break;
        for (int i = 0; i < n + nm; i++) {
            struct ibv_comp_channel *ch = i < n ? p->ch[i] : t->nics[i - n].msg_ch;
            struct ibv_cq *want = i < n ? p->cq[i] : t->nics[i - n].msg_cq;
            if (r > 0 && (fds[i].revents & POLLIN)) {
                struct ibv_cq *cq;
                void *ctx;
                if (!ibv_get_cq_event(ch, &cq, &ctx))
                    ibv_ack_cq_events(cq, 1);
            }
            /* Arm, then poll: a CQE that raced the arming is not lost. */
            ibv_req_notify_cq(want, 0);
            if (i < n)
                drain_cq(t, want, done);
            else
                drain_msg_cq(t, want);
        }
    }
    free(done);
    return NULL;
}

int xrdma_progress_start(struct rdma_transport *t, char *why, size_t why_len)
{
    for (int k = 0; k < t->n_progress; k++) {
        struct rdma_progress *p = &t->progress[k];
        p->t = t;
        p->index = k;
        p->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (p->wake_fd < 0)
            goto fail;
        for (int i = 0; i < t->n_nics; i++) {
            struct ibv_context *ctx = t->nics[i].ctx;
            p->ch[i] = ibv_create_comp_channel(ctx);
            p->cq[i] = p->ch[i] ? ibv_create_cq(ctx, (int)t->cq_depth, p, p->ch[i], k) : NULL;
            if (!p->cq[i])
                goto fail;
            p->cq_room[i] = t->cq_depth;
            ibv_req_notify_cq(p->cq[i], 0);
        }
        if (pthread_create(&p->thread, NULL, progress_main, p))
            goto fail;
        p->running = true;
    }
    return 0;
fail:
    snprintf(why, why_len, "rdma: progress thread setup: %s", strerror(errno));
    return -XFER_EIO;
}

void xrdma_progress_stop(struct rdma_transport *t)
{
    __atomic_store_n(&t->stopping, true, __ATOMIC_RELEASE);
    for (int k = 0; k < t->n_progress; k++) {
        struct rdma_progress *p = &t->progress[k];
        if (p->running) {
            uint64_t one = 1;
            ssize_t w = write(p->wake_fd, &one, sizeof(one));
            (void)w;
            pthread_join(p->thread, NULL);
            p->running = false;
        }
        for (int i = 0; i < t->n_nics; i++) {
            if (p->cq[i])
                ibv_destroy_cq(p->cq[i]);
            if (p->ch[i])
                ibv_destroy_comp_channel(p->ch[i]);
            p->cq[i] = NULL;
            p->ch[i] = NULL;
        }
        if (p->wake_fd > 0)
            close(p->wake_fd);
        p->wake_fd = -1;
    }
}
