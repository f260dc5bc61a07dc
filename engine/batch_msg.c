/*
 * What a batch carries besides READ/WRITE items (docs/notify.md):
 * notifications bound to it (the fence: sent when the last item of their
 * peer ends) and two-sided SEND/RECV items (matched in msg_match.c; a
 * matched RECV runs as a READ of the sender's region, or copies the bytes of
 * an eager RTS, and its end sends the FIN that completes the SEND).
 */
#include "batch.h"
#include "msg_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void batch_unhold_locked(xfer_batch *b)
{
    __atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL);
}

/* ---- notifications ------------------------------------------------------------ */

/* A notification finished: acknowledged by the target or failed. */
static void note_done(struct msg_out *o, int status, const char *why)
{
    xfer_batch *b = o->b;
    pthread_mutex_lock(&b->mu);
    if (b->state == B_RUNNING && o->run == b->notes.run && o->note < b->notes.n &&
        notes_finish(&b->notes, o->note, status, why))
        batch_maybe_finish(b);
    pthread_mutex_unlock(&b->mu);
    xfer_batch_put(b);
}

/* Sends binding k (its items all ended). b->mu held; msg_send only queues.
 * in_submit: from b's own submit (a binding without items), so the answer
 * may be read by b's waiter itself (xfer_notify: no progress-thread wake-up
 * for the acknowledgement), as the answer of a SEND's RTS is. */
static void note_send(xfer_batch *b, size_t k, bool in_submit)
{
    struct msg_out *o = notes_frame(b->engine, &b->notes, k);
    if (!o) {
        notes_finish(&b->notes, k, -XFER_ENOMEM, "out of memory for a notification");
        return; /* the caller's maybe_finish sees it */
    }
    o->b = b;
    o->done = note_done;
    o->m.wait_b = in_submit ? b : NULL; /* msg_send keeps it only in a direct section */
    xfer_batch_hold(b);
    if (msg_send(b->engine, o) < 0) { /* engine shutting down */
        batch_unhold_locked(b);       /* the caller's reference is alive */
        msg_out_free(o);
        notes_finish(&b->notes, k, -XFER_ECANCELED, "engine is shutting down");
    }
}

/* The target's answer to a notification sent behind the data. */
static void behind_done(struct msg_out *o, int status, const char *why)
{
    xfer_batch *b = o->b;
    pthread_mutex_lock(&b->mu);
    if (o->run == b->notes.run && o->note < b->notes.n) { /* binding data of this run */
        if (status == XFER_MSG_NOT_BEHIND) {
            if (notes_behind_declined(&b->notes, o->note))
                note_send(b, o->note, false);
        } else if (b->state == B_RUNNING) {
            notes_finish(&b->notes, o->note, status, why);
        }
        if (b->state == B_RUNNING)
            batch_maybe_finish(b);
    }
    pthread_mutex_unlock(&b->mu);
    xfer_batch_put(b);
}

struct xfer_msg *xfer_batch_note_behind(xfer_batch *b, xfer_peer *p, const size_t *idx, size_t n)
{
    if (!__atomic_load_n(&b->notes.n, __ATOMIC_RELAXED) || !b->engine->msgs.behind)
        return NULL; /* notes.n changes while idle only */
    struct msg_out *o = NULL;
    pthread_mutex_lock(&b->mu);
    bool stopping = __atomic_load_n(&b->stopping, __ATOMIC_ACQUIRE);
    long k = b->state == B_RUNNING && !stopping ? notes_behind_ok(&b->notes, p, n) : -1;
    for (size_t j = 0; k >= 0 && j < n; j++) {
        const struct batch_item *bi = &b->items[idx[j]];
        struct xfer_region_brief rd; /* a GPU target acks after its H2D: not landed yet */
        if (bi->kind != BK_RMA || bi->it.op != XFER_OP_WRITE || bi->it.peer != p || !bi->open ||
            xfer_peer_region_brief(p, bi->it.remote_id, &rd) < 0 || rd.kind != XFER_MEM_HOST)
            k = -1;
    }
    if (k >= 0) {
        o = notes_frame(b->engine, &b->notes, (size_t)k); /* marks it fired */
        if (o && msg_handed(b->engine) < 0) {
            msg_out_free(o);
            o = NULL;
        }
        b->notes.v[k].fired = b->notes.v[k].behind = o != NULL; /* else the fenced way */
        if (o) {
            o->b = b;
            o->done = behind_done;
            xfer_batch_hold(b);
        }
    }
    pthread_mutex_unlock(&b->mu);
    return o ? &o->m : NULL;
}

int xfer_batch_notify(xfer_batch *b, xfer_peer *p, const void *msg, size_t len)
{
    if (!b || !p || p->engine != b->engine || (len && !msg) || len > XFER_NOTIFY_MAX) {
        if (b)
            xfer_engine_set_error(b->engine, "notify: bad peer or message over %u bytes",
                                  XFER_NOTIFY_MAX);
        return -XFER_EINVAL;
    }
    pthread_mutex_lock(&b->mu);
    int rc = b->state == B_RUNNING ? -XFER_EBUSY : notes_bind(&b->notes, p, msg, len);
    pthread_mutex_unlock(&b->mu);
    return rc;
}

int xfer_batch_notify_status(const xfer_batch *b, const xfer_peer *p)
{
    if (!b)
        return -XFER_EINVAL;
    pthread_mutex_lock((pthread_mutex_t *)&b->mu);
    int rc = -XFER_ENOENT;
    for (size_t k = 0; k < b->notes.n; k++)
        if (b->notes.v[k].peer == p)
            rc = b->state == B_IDLE ? -XFER_EINPROGRESS : b->notes.v[k].status;
    pthread_mutex_unlock((pthread_mutex_t *)&b->mu);
    return rc;
}

int xfer_notify(xfer_engine *e, xfer_peer *p, const void *msg, size_t len, int deadline_ms)
{
    int rc;
    xfer_batch *b = xfer_batch_new(e, &rc);
    if (!b)
        return rc;
    rc = xfer_batch_notify(b, p, msg, len);
    if (rc == 0)
        rc = batch_submit_wait(b, deadline_ms);
    if (rc < 0 && b->notes.n && b->notes.v[0].why[0])
        xfer_engine_set_error(e, "notify %s: %s", p->desc.node_id, b->notes.v[0].why);
    xfer_batch_free(b);
    return rc;
}

/* ---- hooks of batch.c (b->mu held) ---------------------------------------------- */

void batch_msg_item_end(xfer_batch *b, size_t i, int status)
{
    struct batch_item *bi = &b->items[i];
    if (bi->kind == BK_RECV && bi->matched && bi->send_id) /* the sender waits for this */
        mm_send_fin(b->engine, bi->from, bi->send_id, status, status == 0 ? bi->it.len : 0);
    else if (bi->kind != BK_RMA && !bi->matched &&
             !(bi->kind == BK_SEND && (bi->local || __atomic_load_n(&bi->unlisted, __ATOMIC_RELAXED))))
        /* Nothing to forget (and no lock and list walk per message) for a
         * matched RECV, whose entry the matcher took off before it could
         * call batch_recv_matched, nor for a locally completed SEND, which
         * batch_msg_start never registered, nor for a SEND whose entry its
         * FIN took (take_send). */
        mm_forget(b->engine, b, i);
    if (b->notes.n && bi->kind == BK_RMA) { /* the fence: a peer's last item sends */
        long k = notes_item_end(&b->notes, bi->it.peer, i, status);
        if (k >= 0)
            note_send(b, (size_t)k, false);
    }
}

void batch_send_unlisted(xfer_batch *b, size_t i)
{
    /* Its item's end then skips mm_forget (a lock and a walk of the RECV
     * list per default SEND). Called under the matcher's mu, so the item
     * has not ended (its end forgets under that mu): b runs and its items
     * stay where they are. Atomic: the end reads it under b->mu only. */
    __atomic_store_n(&b->items[i].unlisted, true, __ATOMIC_RELAXED);
}

void batch_msg_start(xfer_batch *b)
{
    notes_start(&b->notes);
    b->msg_peer = NULL;
    b->msg_many = false;
    b->msg_early = false;
    /* READ/WRITE only and no bindings: nothing to count or register */
    for (size_t i = 0; i < b->n && !(b->all_rma && b->notes.n == 0); i++) {
        struct batch_item *bi = &b->items[i];
        if (bi->kind == BK_RMA) {
            notes_count(&b->notes, bi->it.peer);
            continue;
        }
        xfer_peer *mp = bi->kind == BK_RECV ? bi->want : bi->it.peer;
        b->msg_many |= !mp || (b->msg_peer && b->msg_peer != mp);
        b->msg_peer = mp;
        int rc;
        if (bi->kind == BK_RECV) { /* a former run may have made it a READ */
            bi->it.op = XFER_OP_RECV;
            bi->it.peer = bi->want;
            bi->it.len = bi->cap;
            bi->matched = false;
            bi->from = NULL;
            b->names[bi->name - 1][0] = '\0';
            rc = mm_recv_add(b->engine, b, i, b->notes.run, bi->want, bi->tag, bi->cap,
                             bi->it.local->kind == XFER_MEM_HOST);
            b->msg_early |= rc > 0;
        } else if (bi->local) { /* no FIN comes: nothing to register (batch_msg_submit) */
            bi->send_id = 0;
            rc = 0;
        } else {
            bi->unlisted = false; /* before the entry is seen (under the matcher's mu) */
            rc = mm_send_add(b->engine, b, i, b->notes.run, bi->it.peer, bi->it.len, &bi->send_id);
        }
        if (rc < 0)
            batch_item_end(b, i, rc, "out of memory for a message");
    }
    for (size_t k = 0; k < b->notes.n; k++) /* bindings without items go now */
        if (b->notes.v[k].n_items == 0)
            note_send(b, k, true);
}

void batch_msg_submit(xfer_batch *b)
{
    bool recvs = false;
    for (size_t i = 0; i < b->n; i++) {
        /* Read without the lock: an item's kind and a SEND's fields are set
         * before the submit (its lock published them; send_id by this
         * thread's batch_msg_start) and nothing appends or changes them
         * while the submit runs (submit_run reads the kinds unlocked too);
         * open is atomic (a cancel may end the item now, as it could right
         * after a locked read). One lock per message saved. */
        struct batch_item *bi = &b->items[i];
        if (bi->kind != BK_SEND) {
            recvs |= bi->kind == BK_RECV;
            continue;
        }
        bool go = __atomic_load_n(&bi->open, __ATOMIC_RELAXED), local = bi->local;
        uint64_t id = bi->send_id, tag = bi->tag, len = bi->it.len, off = bi->it.local_off;
        xfer_peer *p = bi->it.peer;
        xfer_region *local_r = bi->it.local;
        if (!go)
            continue;
        struct msg_match *mt = &b->engine->match;
        /* Eager: the bytes ride in the frame (copied by mm_send_*); a
         * local SEND always is (checked at add). */
        bool eager =
            (mt->eager || local) && len <= XFER_MSG_EAGER_MAX && local_r->kind == XFER_MEM_HOST;
        struct xfer_msg_rts r;
        memset(&r, 0, XFER_MSG_RTS_SHORT_SIZE); /* (zeroing src too is ~100 instructions) */
        r.send_id = id;
        r.tag = tag;
        r.len = len;
        r.off = off;
        r.eager = eager ? local_r->ptr + off : NULL;
        r.local = local;
        /* The short RTS (XFER_MSG_F_SHORT) for eager bytes: the receiver
         * copies them (into device memory too) or fails the RECV; it never
         * reads the region, so its description (~650 bytes: built, sent,
         * parsed) stays here. The long form (XFER_MSG_SHORT=0: a receiver
         * before the short RTS) describes it; rendezvous always does. */
        r.short_form = mt->short_rts && eager;
        if (!r.short_form)
            xfer_region_describe(local_r, &r.src); /* pinned by the run */
        if (local)
            mm_send_local(b->engine, b, i, p, &r);
        else
            mm_send_rts(b->engine, b, p, &r);
    }
    /* Messages that arrived before these RECVs: matched here, not by a
     * hand-off to the message thread. None (the RTS queue was empty when
     * they were posted): later ones find them on arrival, and the matcher's
     * lock is not taken for nothing (b->msg_early: set by this thread's
     * batch_msg_start). */
    if (recvs && b->msg_early)
        mm_match_run(b->engine);
}

int batch_recv_matched(xfer_batch *b, size_t i, uint64_t run, xfer_peer *p,
                       const struct xfer_msg_rts *r)
{
    pthread_mutex_lock(&b->mu);
    struct batch_item *bi = i < b->n ? &b->items[i] : NULL;
    if (b->state != B_RUNNING || b->notes.run != run || !bi || !bi->open || bi->matched) {
        batch_put_unlock(b); /* the matcher's hold */
        return -XFER_ENOENT;
    }
    bi->matched = true;
    bi->from = p;
    xfer_copy_str(b->names[bi->name - 1], XFER_NAME_MAX, p->desc.node_id); /* p may go */
    bi->send_id = r->local ? 0 : r->send_id; /* 0: no FIN (a locally completed SEND) */
    bi->tag = r->tag;
    char why[160];
    if (r->len > bi->cap) {
        snprintf(why, sizeof(why), "message of %llu bytes from %s, buffer of %llu",
                 (unsigned long long)r->len, p->desc.node_id, (unsigned long long)bi->cap);
        batch_item_end(b, i, -XFER_ETRUNC, why); /* the FIN tells the sender */
        batch_maybe_finish(b);
        batch_put_unlock(b); /* the matcher's hold */
        return 0;
    }
    xfer_region *dst = bi->it.local;
    /* The bytes came with the RTS: copied here (pinned by the run). Into
     * device memory when there is nothing to READ instead (short form:
     * no region description; local: the sender's buffer may be reused):
     * at most XFER_MSG_EAGER_MAX bytes, and never on a transport's reader
     * (needs_no_post: such a pair is matched by the message thread or the
     * RECV's submitter). */
    if (r->eager && (dst->kind == XFER_MEM_HOST || r->short_form || r->local)) {
        int rc = 0;
        if (dst->kind == XFER_MEM_HOST)
            memcpy(dst->ptr + bi->it.local_off, r->eager, r->len);
        else
            rc = region_cuda_copy_in(dst, bi->it.local_off, r->eager, r->len, why, sizeof(why));
        bi->it.len = rc == 0 ? r->len : 0;
        batch_item_end(b, i, rc, rc == 0 ? NULL : why); /* sends the FIN */
        batch_maybe_finish(b);
        batch_put_unlock(b); /* the matcher's hold */
        return 0;
    }
    /* rendezvous (or the long form's eager bytes for device memory: READ them) */
    xfer_peer_region_add(p, &r->src); /* transports check remote items against it */
    bi->it.op = XFER_OP_READ;
    bi->it.peer = p;
    bi->it.remote_id = r->src.id;
    bi->it.remote_gen = r->src.gen;
    bi->it.remote_off = r->off;
    bi->it.len = r->len;
    if (r->len == 0) {
        batch_item_end(b, i, 0, NULL);
        batch_maybe_finish(b);
        batch_put_unlock(b); /* the matcher's hold */
        return 0;
    }
    pthread_mutex_unlock(&b->mu);
    size_t idx = i;
    batch_post_to_peer(b, p, &idx, 1);
    xfer_batch_put(b);
    return 0;
}

/* ---- two-sided API --------------------------------------------------------------- */

static int add_msg_item(xfer_batch *b, enum xfer_op op, xfer_region *local, uint64_t off,
                        uint64_t len, xfer_peer *p, uint64_t tag, bool local_send)
{
    if (!b || !local || (op == XFER_OP_SEND && !p) || (p && p->engine != b->engine))
        return -XFER_EINVAL;
    if (op == XFER_OP_SEND && !(local->access & XFER_ACCESS_R)) {
        /* the receiver READs the message from this region */
        xfer_engine_set_error(b->engine, "send: region %s does not allow peers to read",
                              local->name);
        return -XFER_EACCES;
    }
    struct xfer_item it = {op, local, off, p, 0, 0, 0, len};
    return batch_append(b, &it, op == XFER_OP_SEND ? BK_SEND : BK_RECV, tag, local_send);
}

int xfer_batch_add_send(xfer_batch *b, xfer_region *local, uint64_t off, uint64_t len, xfer_peer *p,
                        uint64_t tag)
{
    return add_msg_item(b, XFER_OP_SEND, local, off, len, p, tag, false);
}

int xfer_batch_add_recv(xfer_batch *b, xfer_region *local, uint64_t off, uint64_t cap, xfer_peer *p,
                        uint64_t tag)
{
    return add_msg_item(b, XFER_OP_RECV, local, off, cap, p, tag, false);
}

int xfer_batch_add_send_flags(xfer_batch *b, xfer_region *local, uint64_t off, uint64_t len,
                              xfer_peer *p, uint64_t tag, unsigned flags)
{
    if (flags & ~XFER_SEND_LOCAL)
        return -XFER_EINVAL;
    if (!(flags & XFER_SEND_LOCAL))
        return xfer_batch_add_send(b, local, off, len, p, tag);
    /* eager only: its bytes travel in the frame, nobody READs them */
    if (!b || !local || local->kind != XFER_MEM_HOST || len > XFER_MSG_EAGER_MAX)
        return -XFER_EINVAL;
    return add_msg_item(b, XFER_OP_SEND, local, off, len, p, tag, true); /* (marked as added) */
}

/* b->mu held, or b DONE and read after its wait: the bytes item bi moved
 * (a RECV: what it received). */
static uint64_t item_bytes(const struct batch_item *bi)
{
    if (bi->kind == BK_RECV && (!bi->matched || bi->status < 0))
        return 0;
    return bi->it.len;
}

uint64_t xfer_batch_item_bytes(const xfer_batch *b, size_t i)
{
    if (!b || i >= b->n)
        return 0;
    pthread_mutex_lock((pthread_mutex_t *)&b->mu);
    uint64_t n = item_bytes(&b->items[i]);
    pthread_mutex_unlock((pthread_mutex_t *)&b->mu);
    return n;
}

int xfer_batch_item_msg(const xfer_batch *b, size_t i, uint64_t *tag, char *node_id)
{
    if (!b || i >= b->n)
        return -XFER_EINVAL;
    pthread_mutex_lock((pthread_mutex_t *)&b->mu);
    const struct batch_item *bi = &b->items[i];
    int rc = bi->kind == BK_RMA                    ? -XFER_EINVAL
             : bi->kind == BK_RECV && !bi->matched ? -XFER_ENOENT
                                                   : 0;
    if (rc == 0 && tag)
        *tag = bi->tag;
    if (rc == 0 && node_id) /* a copy: the peer may have been removed since */
        snprintf(node_id, XFER_NAME_MAX, "%s", b->names[bi->name - 1]);
    pthread_mutex_unlock((pthread_mutex_t *)&b->mu);
    return rc;
}

static int one_msg(xfer_engine *e, enum xfer_op op, xfer_region *local, uint64_t off, uint64_t len,
                   xfer_peer *p, uint64_t tag, unsigned flags, uint64_t *got, int deadline_ms)
{
    int rc;
    xfer_batch *b = xfer_batch_new(e, &rc);
    if (!b)
        return rc;
    b->unshared = true; /* until the submit */
    rc = op == XFER_OP_SEND ? xfer_batch_add_send_flags(b, local, off, len, p, tag, flags)
                            : add_msg_item(b, op, local, off, len, p, tag, false);
    if (rc >= 0)
        rc = batch_submit_wait(b, deadline_ms);
    /* rc 0: b is DONE, read by the wait (locked, or acquired unlocked) and
     * nobody writes its items any more: no lock (xfer_batch_item_bytes) */
    if (got)
        *got = rc == 0 ? item_bytes(&b->items[0]) : 0;
    if (rc < 0 && b->n > 0 && batch_item_why(b, 0)[0])
        xfer_engine_set_error(e, "%s", batch_item_why(b, 0));
    xfer_batch_free(b);
    return rc;
}

int xfer_send(xfer_engine *e, xfer_region *local, uint64_t off, uint64_t len, xfer_peer *p,
              uint64_t tag, int deadline_ms)
{
    return one_msg(e, XFER_OP_SEND, local, off, len, p, tag, 0, NULL, deadline_ms);
}

int xfer_send_flags(xfer_engine *e, xfer_region *local, uint64_t off, uint64_t len, xfer_peer *p,
                    uint64_t tag, unsigned flags, int deadline_ms)
{
    return one_msg(e, XFER_OP_SEND, local, off, len, p, tag, flags, NULL, deadline_ms);
}

int xfer_recv(xfer_engine *e, xfer_region *local, uint64_t off, uint64_t cap, xfer_peer *p,
              uint64_t tag, uint64_t *got, int deadline_ms)
{
    return one_msg(e, XFER_OP_RECV, local, off, cap, p, tag, 0, got, deadline_ms);
}
