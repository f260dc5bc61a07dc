/*
 * Notifications bound to a batch: one binding per peer, the per-run count of
 * that peer's open items (the fence), the failed items to name, and the
 * frame sent when the count reaches zero. Everything here runs under the
 * batch's mu (batch.c calls in); the sending goes through msg.c.
 */
#include "internal.h"
#include "msg_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct batch_note *find(struct batch_notes *ns, const xfer_peer *p)
{
    for (size_t k = 0; k < ns->n; k++)
        if (ns->v[k].peer == p)
            return &ns->v[k];
    return NULL;
}

/* Room for one more binding: the first lives in ns->one1. */
static bool notes_room(struct batch_notes *ns)
{
    if (ns->n < ns->cap)
        return true;
    if (!ns->v) {
        ns->v = ns->one1;
        ns->cap = 1;
        return true;
    }
    size_t cap = 2 * ns->cap < 4 ? 4 : 2 * ns->cap;
    struct batch_note *v =
        ns->v == ns->one1 ? malloc(cap * sizeof(*v)) : realloc(ns->v, cap * sizeof(*v));
    if (!v)
        return false;
    if (ns->v == ns->one1)
        memcpy(v, ns->one1, sizeof(ns->one1));
    ns->v = v;
    ns->cap = cap;
    return true;
}

int notes_bind(struct batch_notes *ns, xfer_peer *p, const void *msg, size_t len)
{
    uint8_t *copy = NULL;
    if (len > NOTE_INLINE && !(copy = malloc(len)))
        return -XFER_ENOMEM;
    struct batch_note *nt = find(ns, p);
    if (!nt) {
        if (!notes_room(ns)) {
            free(copy);
            return -XFER_ENOMEM;
        }
        nt = &ns->v[ns->n++];
        memset(nt, 0, sizeof(*nt));
        nt->peer = p;
    }
    free(nt->msg);
    nt->msg = copy;
    if (len)
        memcpy(copy ? copy : nt->inl, msg, len);
    nt->len = len;
    return 0;
}

void notes_free(struct batch_notes *ns)
{
    if (!ns->v) /* none bound (every message and most batches) */
        return;
    for (size_t k = 0; k < ns->n; k++) {
        free(ns->v[k].msg);
        free(ns->v[k].failed);
    }
    if (ns->v != ns->one1)
        free(ns->v);
    memset(ns, 0, sizeof(*ns));
}

void notes_start(struct batch_notes *ns)
{
    ns->run++;
    ns->n_unacked = ns->n;
    for (size_t k = 0; k < ns->n; k++) {
        struct batch_note *nt = &ns->v[k];
        nt->n_items = nt->n_open = nt->n_failed = nt->n_listed = 0;
        nt->fired = nt->behind = false;
        nt->status = -XFER_EINPROGRESS;
        nt->why[0] = '\0';
    }
}

void notes_count(struct batch_notes *ns, xfer_peer *p)
{
    struct batch_note *nt = find(ns, p);
    if (nt) {
        nt->n_items++;
        nt->n_open++;
    }
}

/* Remembers a failed item; beyond XFER_NOTIFY_FAILED_MAX only counts it. */
static void note_failed(struct batch_note *nt, size_t idx, int status)
{
    nt->n_failed++;
    if (nt->n_listed == XFER_NOTIFY_FAILED_MAX)
        return;
    if (nt->n_listed == nt->cap_listed) {
        uint32_t cap = nt->cap_listed ? 2 * nt->cap_listed : 8;
        struct xfer_notif_fail *v = realloc(nt->failed, cap * sizeof(*v));
        if (!v)
            return; /* still counted: the receiver sees n_failed > n_listed */
        nt->failed = v;
        nt->cap_listed = cap;
    }
    nt->failed[nt->n_listed++] = (struct xfer_notif_fail){(uint32_t)idx, status};
}

long notes_item_end(struct batch_notes *ns, xfer_peer *p, size_t idx, int status)
{
    struct batch_note *nt = find(ns, p);
    if (!nt || nt->n_open == 0)
        return -1;
    if (status < 0)
        note_failed(nt, idx, status);
    if (--nt->n_open > 0 || nt->fired)
        return -1;
    return nt - ns->v;
}

long notes_behind_ok(const struct batch_notes *ns, const xfer_peer *p, size_t n)
{
    for (size_t k = 0; k < ns->n; k++) {
        const struct batch_note *nt = &ns->v[k];
        if (nt->peer == p)
            return !nt->fired && n > 0 && nt->n_items == n && nt->n_open == n ? (long)k : -1;
    }
    return -1;
}

bool notes_behind_declined(struct batch_notes *ns, size_t k)
{
    struct batch_note *nt = &ns->v[k];
    if (!nt->behind)
        return false;
    /* also after a cancel or deadline finished the binding: the target
     * still learns the items' fate, as it would without the shortcut */
    nt->behind = nt->fired = false;
    return nt->n_open == 0;
}

static int fail_cmp(const void *a, const void *b)
{
    uint32_t x = ((const struct xfer_notif_fail *)a)->index;
    uint32_t y = ((const struct xfer_notif_fail *)b)->index;
    return x < y ? -1 : x > y;
}

struct msg_out *notes_frame(xfer_engine *e, struct batch_notes *ns, size_t k)
{
    struct batch_note *nt = &ns->v[k];
    nt->fired = true;
    /* Items end in any order; the receiver gets them by index, and the
     * first failure's code (as xfer_batch_poll reports it) as the status. */
    if (nt->n_listed > 1)
        qsort(nt->failed, nt->n_listed, sizeof(*nt->failed), fail_cmp);
    /* Out of memory for the list: still say that items failed. */
    static const struct xfer_notif_fail unknown = {UINT32_MAX, -XFER_ENOMEM};
    const struct xfer_notif_fail *failed = nt->n_listed ? nt->failed : &unknown;
    uint32_t n_listed = nt->n_failed && !nt->n_listed ? 1 : nt->n_listed;
    struct xfer_msg_hdr h = {
        .kind = XFER_MSG_NOTIFY,
        .flags = nt->n_items ? XFER_MSG_F_BOUND : 0,
        .seq = msg_next_seq(e),
        .status = nt->n_failed ? failed[0].status : 0,
        .n_items = nt->n_items,
        .n_failed = nt->n_failed,
        .n_listed = n_listed,
        .msg_len = (uint32_t)nt->len,
    };
    struct msg_out *o = msg_out_new(xfer_msg_frame_len(&h));
    if (!o)
        return NULL;
    xfer_msg_encode(&h, failed, nt->msg ? nt->msg : nt->inl, (uint8_t *)o->m.frame);
    o->peer = nt->peer;
    o->note = k;
    o->run = ns->run;
    return o;
}

bool notes_finish(struct batch_notes *ns, size_t k, int status, const char *why)
{
    struct batch_note *nt = &ns->v[k];
    if (nt->status != -XFER_EINPROGRESS)
        return false;
    nt->status = status;
    if (status < 0)
        snprintf(nt->why, sizeof(nt->why), "%s", why && *why ? why : xfer_strerror(status));
    ns->n_unacked--;
    return true;
}

void notes_abort(struct batch_notes *ns, int status, const char *why)
{
    for (size_t k = 0; k < ns->n; k++)
        notes_finish(ns, k, status, why);
}

int notes_result(const struct batch_notes *ns)
{
    for (size_t k = 0; k < ns->n; k++)
        if (ns->v[k].status < 0)
            return ns->v[k].status;
    return 0;
}
