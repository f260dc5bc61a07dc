/*
 * One connection for messages both ways (docs/notify.md, "Messages back on
 * the peer's connection").
 *
 * A message goes out as MSG_REQ on a connection its sender opened, and the
 * answer comes back there. Two nodes that message each other so used two
 * connections: each message was alone in its direction on its connection,
 * so the receiving kernel sent a pure ACK for it, and each side's waiter
 * polled one socket for the peer's messages and another for its answers.
 * Now, of two nodes, the one whose id sorts first offers (handshake purpose
 * bit TCP_PURPOSE_BACK, on its first socket to the other) to take messages
 * back on its connection, and the other sends its messages there: both
 * directions share one stream, the ACK rides on the next message, and a
 * waiter reads one socket (a solo waiter: one blocking recv).
 *
 * Order: messages of one connection to a peer must arrive in the order sent
 * (two-sided matching is FIFO). So a connection's path is chosen at its
 * first message (back, if the peer's offering socket is there then, else
 * its own sockets) and only ever changes to its own sockets: when that
 * accepted socket closes or another replaces it. A message queued on the
 * closing socket fails -XFER_ECONN like one on a closing socket of its own;
 * one already written there may still be unread by the peer while the next
 * one arrives on the other connection (the same as a repair replacing a
 * connection). A node that sent before the peer connected keeps to its own
 * connection: two connections, as before.
 *
 * Accepted sockets are freed by their owner's reap, which keeps a pinned
 * one: a sender pins the socket (under in_mu, where the table is) for as
 * long as it touches it. XFER_TCP_BACK=0: off (nothing offered, nothing
 * sent back).
 */
#include "tcp.h"

#include <stdlib.h>
#include <string.h>

bool tcp_back_offer(struct tcp_transport *tt, const char *peer, uint32_t index)
{
    const char *me = xfer_engine_config_get(tt->engine)->node_id;
    return tt->back && index == 0 && strcmp(me, peer) < 0;
}

void tcp_back_note(struct tcp_sock *s)
{
    if (!s->back_out)
        return;
    struct tcp_transport *tt = s->tt;
    pthread_mutex_lock(&tt->in_mu);
    /* Else it closed already (tcp_back_drop ran). A newer one replaces the
     * older; atomic: back_known reads the slot without in_mu. */
    if (!s->in_gone)
        __atomic_store_n(&tt->back_sock[s->peer_hash], s, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&tt->in_mu);
}

void tcp_back_drop(struct tcp_sock *s)
{
    s->in_gone = true;
    struct tcp_sock **slot = &s->tt->back_sock[s->peer_hash];
    if (*slot == s)
        __atomic_store_n(slot, NULL, __ATOMIC_RELAXED);
}

/* in_mu held: the accepted socket d's node offered, if it is live, has an
 * owner already (it is noted before), and is of d's incarnation (0: not
 * known yet, any), pinned; else NULL. */
static struct tcp_sock *back_pin(struct tcp_transport *tt, const struct xfer_peer_desc *d,
                                 unsigned hash)
{
    struct tcp_sock *s = tt->back_sock[hash];
    if (!s || !__atomic_load_n(&s->th, __ATOMIC_ACQUIRE) || strcmp(s->peer_node, d->node_id) != 0 ||
        (d->incarnation && s->peer_inc != d->incarnation) ||
        __atomic_load_n(&s->dead, __ATOMIC_RELAXED))
        return NULL;
    __atomic_add_fetch(&s->pins, 1, __ATOMIC_ACQ_REL);
    return s;
}

/* The socket tc's next message goes back on, pinned, or NULL (its own
 * sockets); decides the path at the first message (see top). */
static struct tcp_sock *back_path(struct tcp_conn *tc)
{
    struct tcp_transport *tt = tc->tt;
    const struct xfer_peer_desc *d = xfer_peer_desc_get(tc->base.peer);
    pthread_mutex_lock(&tc->back_mu);
    struct tcp_sock *s = NULL;
    if (tc->path != TCP_PATH_OWN) {
        pthread_mutex_lock(&tt->in_mu);
        s = back_pin(tt, d, tc->peer_hash);
        pthread_mutex_unlock(&tt->in_mu);
    }
    if (s && tc->path == TCP_PATH_UNDECIDED) {
        tc->back_sock = s; /* pinned once more: until tcp_disconnect */
        __atomic_add_fetch(&s->pins, 1, __ATOMIC_ACQ_REL);
        /* after back_sock: back_known reads them without back_mu */
        __atomic_store_n(&tc->path, TCP_PATH_BACK, __ATOMIC_RELEASE);
        xfer_debug("tcp: messages to %s go back on its connection %s", d->node_id, s->name);
    } else if (s && s != tc->back_sock) { /* another connection of the peer: not that one */
        __atomic_sub_fetch(&s->pins, 1, __ATOMIC_ACQ_REL);
        s = NULL;
    }
    if (!s && tc->path != TCP_PATH_OWN) {
        if (tc->path == TCP_PATH_BACK)
            xfer_debug("tcp: messages to %s go on our own connection from now on", d->node_id);
        __atomic_store_n(&tc->path, TCP_PATH_OWN, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&tc->back_mu);
    return s;
}

/* ---- answers ride along ---------------------------------------------------------
 *
 * On a connection used both ways, a waiter that read the peer's message
 * queues its answer, and this side's next message usually follows within
 * microseconds: sent apart they are two segments, and the second pushed
 * segment in a row makes the receiving kernel acknowledge at once (a pure
 * ACK), and the peer's waiter wakes twice. Held, the answer goes out in the
 * next frame's sendmsg. But a peer that waits for the answer while this
 * side sends nothing would wait for the owner's tick (100 us), so a socket
 * holds only after TCP_HOLD_AFTER answers in a row were followed by this
 * side's next frame within TCP_HOLD_WINDOW_US, and stops holding once the
 * tick had to send one (kicking the owner for each held answer instead cost
 * more than the segments saved: docs/notify.md). */

static void held_enter(struct tcp_sock *s)
{
    if (s->on_held)
        return;
    struct tcp_thread *th = s->th;
    pthread_mutex_lock(&th->mu);
    s->on_held = true;
    s->held_next = th->held_head;
    th->held_head = s;
    __atomic_store_n(&th->held_n, th->held_n + 1, __ATOMIC_SEQ_CST);
    bool wake = !__atomic_load_n(&th->tick_fine, __ATOMIC_SEQ_CST); /* see lazy_enter */
    pthread_mutex_unlock(&th->mu);
    if (wake)
        tcp_thread_wake(th);
}

/* (s may be on tcp_held_tick's detached list instead, when its send there
 * failed: not found here, counted out all the same; the tick checks
 * on_held.) */
void tcp_held_unlink(struct tcp_sock *s)
{
    if (!s->on_held)
        return;
    for (struct tcp_sock **pp = &s->th->held_head; *pp; pp = &(*pp)->held_next) {
        if (*pp == s) {
            *pp = s->held_next;
            break;
        }
    }
    s->on_held = false;
    __atomic_store_n(&s->th->held_n, s->th->held_n - 1, __ATOMIC_RELAXED);
}

bool tcp_answers_hold(struct tcp_sock *s)
{
    bool both_ways = s->back_in || __atomic_load_n(&s->back_used, __ATOMIC_RELAXED);
    if (!s->tt->hold || !s->answers || !s->by_waiter || !both_ways || s->out_armed ||
        s->tx_count != s->held + s->answers)
        return false; /* the owner's read, or other frames to send: now */
    int64_t now = xfer_mono_ns();
    if (!s->hold_on) {
        s->ans_ns = now; /* sent now: does this side's next frame follow soon? */
        return false;
    }
    if (!s->held)
        s->held_ns = now;
    s->held += s->answers;
    held_enter(s);
    return true;
}

/* One more sample of "the frame sent alone at *since was followed by this
 * side's next frame within the window": true once TCP_HOLD_AFTER in a row. */
static bool followed_soon(struct tcp_sock *s, int64_t *since, uint8_t *streak, int64_t now)
{
    bool soon = now - *since <= s->tt->hold_window_ns;
    *since = 0;
    *streak = soon ? *streak + 1 : 0;
    return *streak >= TCP_HOLD_AFTER;
}

void tcp_answers_learn(struct tcp_sock *s, bool ride)
{
    /* An answer went alone (holding off) and this is this side's next
     * frame, whether or not it carries held FINs: with FINs riding already,
     * every next frame of a blocking ping-pong carries one, and answers were
     * learned only by chance, 47-100 ms into a run (H200: 16 of 60 runs
     * at 2.2-4.1 segments per round trip; docs/perf.md step 18). */
    bool answers = s->ans_ns != 0;
    if (!s->tt->hold || (!ride && !s->ride_ns && !answers))
        return; /* holding off, or the usual frame: no clock read */
    int64_t now = xfer_mono_ns();
    if (ride) {
        s->ride_ns = now; /* sent alone: does this side's next frame follow soon? */
    } else if (s->ride_ns && followed_soon(s, &s->ride_ns, &s->ride_streak, now) && !s->ride_on) {
        s->ride_on = true;
        xfer_debug("tcp: %s: FINs wait for the next frame", s->name);
    }
    if (!answers)
        return; /* no answer sent alone before (none, or held: holding is on) */
    if (followed_soon(s, &s->ans_ns, &s->hold_streak, now) && !s->hold_on) {
        s->hold_on = true;
        xfer_debug("tcp: %s: answers wait for the next frame", s->name);
    }
}

/* A FIN ends the peer's SEND, but in a blocking ping-pong (xfer_send then
 * xfer_recv on both sides) its peer's next step is a RECV that waits for
 * this side's next message anyway, and this side's RECV that sent the FIN
 * is followed by that message within microseconds: sent apart they are two
 * segments and two wake-ups of the peer. Learned and undone as answers
 * are (ride_on, above; the tick sends one nobody carried and stops). */
bool tcp_ride_hold(struct tcp_sock *s)
{
    /* (ride_on is only ever learned with holding on: tcp_answers_learn) */
    if (!s->ride_on || s->out_armed || !tcp_sock_take_queue(s) || s->tx_count != s->held + 1)
        return false;
    if (!s->held)
        s->held_ns = xfer_mono_ns();
    s->held++;
    held_enter(s);
    return true;
}

void tcp_held_tick(struct tcp_thread *th)
{
    pthread_mutex_lock(&th->mu);
    struct tcp_sock *s = th->held_head;
    th->held_head = NULL;
    pthread_mutex_unlock(&th->mu);
    int64_t now = xfer_mono_ns(), young = th->tt->hold_window_ns;
    while (s) {
        struct tcp_sock *next = s->held_next;
        bool locked = pthread_mutex_trylock(&s->iomu) == 0; /* busy: next tick */
        bool keep = !locked;
        if (locked && s->held && s->fd >= 0) {
            if (now - s->held_ns < young) { /* its frame may still come */
                keep = true;
            } else { /* nobody carried them: send, stop holding */
                xfer_debug("tcp: %s: no frame came for %u held frames: sent, holding stops",
                           s->name, s->held);
                s->hold_on = s->ride_on = false;
                s->hold_streak = s->ride_streak = 0;
                tcp_sock_writable(s);
            }
        }
        /* on_held changes under iomu and mu (see lazy_enter). A send above
         * that failed closed s, and its close took s off (tcp_held_unlink:
         * on_held false, counted out): not twice. */
        pthread_mutex_lock(&th->mu);
        if (keep && s->on_held) {
            s->held_next = th->held_head;
            th->held_head = s;
        } else if (s->on_held) {
            s->on_held = false;
            __atomic_store_n(&th->held_n, th->held_n - 1, __ATOMIC_RELAXED);
        }
        pthread_mutex_unlock(&th->mu);
        if (locked)
            pthread_mutex_unlock(&s->iomu);
        s = next;
    }
}

/* The path decided BACK and its socket still the peer's live one: that
 * socket, without back_mu, in_mu nor a pin of the message's own (two lock
 * rounds and two atomic adds per message sent back). tc->back_sock holds a
 * pin until tcp_disconnect, which cannot run while the caller holds the
 * peer's conn_lock. A replacement (the table names another socket) or a
 * close racing with this look is the same race back_path has right after
 * it unlocks: the frame goes on s, or its append fails and the path turns
 * to our own sockets. NULL: ask back_path. */
static struct tcp_sock *back_known(struct tcp_conn *tc)
{
    if (__atomic_load_n(&tc->path, __ATOMIC_ACQUIRE) != TCP_PATH_BACK)
        return NULL;
    struct tcp_sock *s = tc->back_sock;
    if (!s || __atomic_load_n(&tc->tt->back_sock[tc->peer_hash], __ATOMIC_RELAXED) != s ||
        __atomic_load_n(&s->dead, __ATOMIC_RELAXED))
        return NULL;
    return s;
}

int tcp_back_send(struct tcp_conn *tc, struct tcp_tx *t)
{
    if (__atomic_load_n(&tc->path, __ATOMIC_RELAXED) == TCP_PATH_OWN)
        return 1; /* the usual look once decided: no lock */
    struct tcp_sock *s = back_known(tc);
    bool pinned = !s;
    if (!s && !(s = back_path(tc)))
        return 1;
    bool ride = t->msg && t->msg->ride; /* (t is not ours once queued) */
    /* Before the frame is queued: its owner (or a direct sender) moves the
     * shared queue of an accepted socket only once this is set. */
    __atomic_store_n(&s->back_used, true, __ATOMIC_RELEASE);
    t->back_tc = tc;
    bool queued = tcp_sock_append(s, t);
    if (queued) {
        tcp_out_note(s); /* its answer comes there: a notification waiter reads it */
        if (!(tc->tt->direct && tcp_sock_send_direct(s, ride)))
            tcp_thread_kick(s);
    }
    if (pinned)
        __atomic_sub_fetch(&s->pins, 1, __ATOMIC_ACQ_REL);
    if (queued)
        return 0;
    pthread_mutex_lock(&tc->back_mu); /* it closed meanwhile: own sockets from now on */
    __atomic_store_n(&tc->path, TCP_PATH_OWN, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&tc->back_mu);
    return 1;
}

/* Unlinks the frames of tc that have not started (hdr_sent 0) from the
 * list at *head (tail and count kept) onto *out; the started ones of tc
 * are orphaned: their message ends now, a half-written one finishes from
 * a copy. */
static void take_mine(struct tcp_tx **head, struct tcp_tx **tail, size_t *count,
                      struct tcp_conn *tc, struct tcp_tx **out, const char *why)
{
    struct tcp_tx *prev = NULL;
    for (struct tcp_tx *t = *head, *next; t; t = next) {
        next = t->next;
        if (t->back_tc != tc || t->orphan) {
            prev = t;
            continue;
        }
        if (t->hdr_sent > 0) { /* on the wire: it stays, without its message */
            uint8_t *copy = t->payload_sent < t->payload_len ? malloc(t->payload_len) : NULL;
            if (copy) {
                memcpy(copy, t->payload, t->payload_len);
                t->own = t->payload = copy;
            } else if (t->payload_sent < t->payload_len) {
                t->pad = true; /* no memory: the rest goes as zeros, refused there */
            }
            xfer_msg_done(t->msg, -XFER_ECONN, why);
            t->msg = NULL;
            t->orphan = true;
            prev = t;
            continue;
        }
        if (prev)
            prev->next = next;
        else
            *head = next;
        if (*tail == t)
            *tail = prev;
        if (count)
            (*count)--;
        t->next = *out;
        *out = t;
    }
}

void tcp_back_detach(struct tcp_conn *tc)
{
    struct tcp_sock *s = tc->back_sock;
    if (!s)
        return;
    const char *why = "disconnected (the message went back on the peer's connection)";
    struct tcp_tx *gone = NULL;
    pthread_mutex_lock(&s->iomu); /* (then qmu, as a sender splicing) */
    pthread_mutex_lock(&s->qmu);
    take_mine(&s->q_head, &s->q_tail, NULL, tc, &gone, why);
    pthread_mutex_unlock(&s->qmu);
    take_mine(&s->tx_head, &s->tx_tail, &s->tx_count, tc, &gone, why);
    if (s->held > s->tx_count) /* a held FIN of tc's was taken */
        s->held = (uint32_t)s->tx_count;
    for (struct tcp_tx *t = s->inf_head; t; t = t->next) {
        if (t->back_tc == tc && !t->orphan) { /* written: its answer is still read */
            xfer_msg_done(t->msg, -XFER_ECONN, why);
            t->msg = NULL;
            t->orphan = true;
        }
    }
    while (gone) {
        struct tcp_tx *next = gone->next;
        tcp_chunk_complete(s, gone, -XFER_ECONN, why);
        gone = next;
    }
    pthread_mutex_unlock(&s->iomu);
    __atomic_sub_fetch(&s->pins, 1, __ATOMIC_ACQ_REL);
    tc->back_sock = NULL;
}
