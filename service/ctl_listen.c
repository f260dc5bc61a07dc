/*
 * Notification listeners (xferctl listen): control connections subscribed
 * with a Listen request get every notification that arrives at this xferd's
 * engine, as Response{id, notif} frames. Runs on the loop thread only.
 *
 * Nothing is lost (docs/service.md "Notifications"): a notification stays
 * in the engine's bounded queue (senders see -XFER_ENOSPC when it is full)
 * until a listener has room for it; one taken from the queue is sent to
 * every listener with room and kept here ("held") until one of them
 * acknowledges it (ListenAck, cumulative: the client sends it after it
 * printed the line). Each listener has a window of unacknowledged ones
 * (LISTEN_WINDOW notifications, LISTEN_WIN_BYTES bytes); nothing more is
 * taken from the queue while any listener's window is full (back-pressure
 * to the senders). A listener that acknowledges nothing for io_timeout_ms
 * while it has some outstanding is cut (warn line); one that goes away or
 * is cut gives back what it did not acknowledge: those nobody else
 * acknowledged either go, in their order, to the listeners before anything
 * new from the queue. So every notification is acknowledged by at least
 * one listener, and a listener never gets one twice (docs: exactly once
 * unless a listener stops between printing a line and acknowledging it).
 * With a count, a listener is sent no more than that; after it is complete
 * it only waits for its acknowledgements.
 */
#include "ctl_conn.h"
#include "notify_tag.h"
#include "xfer_io.h"

#include <stdlib.h>
#include <string.h>

#define LISTEN_MAX       64         /* listeners per xferd */
#define LISTEN_WINDOW    32         /* unacknowledged notifications per listener */
#define LISTEN_WIN_BYTES (1u << 20) /* ... and their reply bytes */

/* A notification taken from the engine's queue and not yet acknowledged. */
struct held {
    struct xfer_notif *n;
    size_t bytes;      /* its reply frame's size, for the windows */
    int refs;          /* listeners holding it unacknowledged, + the sender while sending */
    bool acked;        /* a listener acknowledged it */
    struct held *next; /* in the given-back queue */
};

struct listener {
    struct conn *c;
    uint64_t id;
    bool limited;                    /* a count was given ... */
    uint32_t left;                   /* ... and this many are still to send */
    struct held *win[LISTEN_WINDOW]; /* sent, unacknowledged, oldest at [head] */
    unsigned head, n;
    size_t win_bytes;
    uint64_t sent, acked;
    int64_t stalled_since_ms; /* outstanding and no acknowledgement since; 0 = none */
    struct listener *next;
};

struct ctl_listen {
    struct ctl_server *s;
    struct event *ev;    /* the engine's notification eventfd */
    struct event *timer; /* cut of stalled listeners, delivery of given-back ones */
    struct listener *head;
    struct held *back, *back_tail; /* given back by listeners that went away */
    struct notify_seen seen;       /* copies delivered (retries dropped) */
    int n;
    bool armed;
};

static void listen_pump(struct ctl_server *s);

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    listen_pump(arg);
}

static struct ctl_listen *listen_state(struct ctl_server *s)
{
    if (s->listen)
        return s->listen;
    struct ctl_listen *l = calloc(1, sizeof(*l));
    if (!l)
        return NULL;
    l->s = s;
    l->ev = event_new(s->d->base, xfer_notif_fd(s->d->eng), EV_READ | EV_PERSIST, on_wake, s);
    l->timer = evtimer_new(s->d->base, on_wake, s);
    if (!l->ev || !l->timer) {
        if (l->ev)
            event_free(l->ev);
        if (l->timer)
            event_free(l->timer);
        free(l);
        return NULL;
    }
    return s->listen = l;
}

static void arm(struct ctl_listen *l, bool on)
{
    if (l->armed == on)
        return;
    l->armed = on;
    if (on)
        event_add(l->ev, NULL);
    else
        event_del(l->ev);
}

static void wake_in(struct ctl_listen *l, int64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    evtimer_add(l->timer, &tv);
}

/* Drops one reference to h: the last one frees it when a listener
 * acknowledged it, else queues it for the next listener. */
static void held_put(struct ctl_listen *l, struct held *h)
{
    if (--h->refs > 0)
        return;
    if (h->acked) {
        xfer_notif_free(h->n);
        free(h);
        return;
    }
    h->next = NULL;
    if (l->back_tail)
        l->back_tail->next = h;
    else
        l->back = h;
    l->back_tail = h;
}

/* Takes the oldest of x's window off it (acknowledged or given back). */
static void win_pop(struct ctl_listen *l, struct listener *x, bool acked)
{
    struct held *h = x->win[x->head];
    x->head = (x->head + 1) % LISTEN_WINDOW;
    x->n--;
    x->win_bytes -= h->bytes;
    if (acked)
        h->acked = true;
    held_put(l, h);
}

static void unlink_listener(struct ctl_listen *l, struct listener *x)
{
    for (struct listener **pp = &l->head; *pp; pp = &(*pp)->next)
        if (*pp == x) {
            *pp = x->next;
            break;
        }
    while (x->n)
        win_pop(l, x, false);
    x->c->listening = false;
    l->n--;
    free(x);
    if (!l->head)
        arm(l, false);
    if (l->back && l->head)
        wake_in(l, 0); /* the given-back ones go to the others (not from inside conn_close) */
}

static struct listener *find(struct ctl_listen *l, const struct conn *c)
{
    for (struct listener *x = l ? l->head : NULL; x; x = x->next)
        if (x->c == c)
            return x;
    return NULL;
}

void ctl_listen_drop(struct conn *c)
{
    struct listener *x = c->listening ? find(c->s->listen, c) : NULL;
    if (x)
        unlink_listener(c->s->listen, x);
}

static void send_resp(struct conn *c, const Xctl__Response *r)
{
    size_t len = xctl__response__get_packed_size(r);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        conn_close(c);
        return;
    }
    xctl__response__pack(r, buf);
    conn_send_raw(c, buf, len);
    free(buf);
}

int ctl_listen_add(struct conn *c, uint64_t id, uint32_t count, char *why, size_t wl)
{
    struct ctl_listen *l = listen_state(c->s);
    if (!l) {
        snprintf(why, wl, "out of memory");
        return -XFER_ENOMEM;
    }
    if (c->listening) {
        snprintf(why, wl, "this connection listens already");
        return -XFER_EINVAL;
    }
    if (l->n >= LISTEN_MAX) {
        snprintf(why, wl, "xferd serves at most %d listeners; try again later", LISTEN_MAX);
        return -XFER_EBUSY;
    }
    struct listener *x = calloc(1, sizeof(*x));
    if (!x) {
        snprintf(why, wl, "out of memory");
        return -XFER_ENOMEM;
    }
    x->c = c;
    x->id = id;
    x->limited = count > 0;
    x->left = count;
    x->next = l->head;
    l->head = x;
    l->n++;
    c->listening = true;
    Xctl__Response r = XCTL__RESPONSE__INIT;
    r.id = id; /* status 0, no body: subscribed */
    send_resp(c, &r);
    if (!c->dead)
        listen_pump(c->s); /* what waits goes out now */
    return 0;
}

int ctl_listen_ack(struct conn *c, uint64_t count, char *why, size_t wl)
{
    struct ctl_listen *l = c->s->listen;
    struct listener *x = c->listening ? find(l, c) : NULL;
    if (!x) {
        snprintf(why, wl, "acknowledgement on a connection that does not listen");
        return -XFER_EINVAL;
    }
    if (count < x->acked || count > x->sent) {
        snprintf(why, wl, "acknowledges %llu notification(s); %llu were sent, %llu acknowledged",
                 (unsigned long long)count, (unsigned long long)x->sent,
                 (unsigned long long)x->acked);
        return -XFER_EINVAL;
    }
    if (count == x->acked)
        return 0;
    for (; x->acked < count; x->acked++)
        win_pop(l, x, true);
    x->stalled_since_ms = x->n ? xfer_now_ms() : 0;
    listen_pump(c->s);
    return 0;
}

static Xctl__Notification *notif_msg(const struct xfer_notif *n, Xctl__Notification *m,
                                     Xctl__FailedItem *fi, Xctl__FailedItem **fp)
{
    xctl__notification__init(m);
    m->node = (char *)n->node_id;
    m->incarnation = n->incarnation;
    m->seq = n->seq;
    m->bound = n->bound;
    m->status = n->status;
    m->n_items = n->n_items;
    m->failed_count = n->n_failed;
    for (uint32_t i = 0; i < n->n_listed; i++) {
        xctl__failed_item__init(&fi[i]);
        fi[i].index = n->failed[i].index;
        fi[i].status = n->failed[i].status;
        fp[i] = &fi[i];
    }
    m->n_failed = n->n_listed;
    m->failed = fp;
    m->text.data = n->data;
    m->text.len = n->len;
    return m;
}

static bool active(const struct listener *x)
{
    return !x->limited || x->left > 0;
}

static bool has_room(const struct listener *x)
{
    return x->n < LISTEN_WINDOW && x->win_bytes < LISTEN_WIN_BYTES;
}

/* Sends h to every listener still taking new ones (all have room). */
static void fan_out(struct ctl_listen *l, struct held *h)
{
    Xctl__FailedItem *fi = calloc(h->n->n_listed + 1, sizeof(*fi));
    Xctl__FailedItem **fp = calloc(h->n->n_listed + 1, sizeof(*fp));
    Xctl__Notification m;
    h->refs = 1; /* ours: a listener closing under us must not give it back yet */
    if (!fi || !fp) {
        xfer_err("listeners: out of memory: a notification from %s waits", h->n->node_id);
        free(fi);
        free(fp);
        held_put(l, h);
        return;
    }
    notif_msg(h->n, &m, fi, fp);
    Xctl__Response r = XCTL__RESPONSE__INIT;
    r.body_case = XCTL__RESPONSE__BODY_NOTIF;
    r.notif = &m;
    h->bytes = xctl__response__get_packed_size(&r) + 16;
    for (struct listener *x = l->head, *next; x; x = next) {
        next = x->next;
        if (!active(x))
            continue;
        struct conn *c = x->c;
        x->win[(x->head + x->n++) % LISTEN_WINDOW] = h;
        h->refs++;
        x->win_bytes += h->bytes;
        x->sent++;
        x->left -= x->limited;
        if (x->n == 1)
            x->stalled_since_ms = xfer_now_ms();
        r.id = x->id;
        c->refs++; /* a failed send closes c (and drops x), c must outlive this loop */
        send_resp(c, &r);
        conn_put(c);
    }
    free(fi);
    free(fp);
    held_put(l, h);
}

/* Cuts listeners that acknowledged nothing for io_timeout_ms while holding
 * some; returns the time of the next such check (0: none needed). */
static int64_t cut_stalled(struct ctl_listen *l)
{
    int64_t now = xfer_now_ms(), limit = l->s->d->cfg.io_timeout_ms, next_at = 0;
    for (struct listener *x = l->head, *next; x; x = next) {
        next = x->next;
        if (!x->n)
            continue;
        int64_t at = x->stalled_since_ms + limit;
        if (now > at) {
            xfer_warn("control: a notification listener acknowledged none of %u notification(s) "
                      "for over %lld ms: disconnected; they go to the next listener",
                      x->n, (long long)limit);
            conn_close(x->c); /* drops x, gives its window back */
            continue;
        }
        if (!next_at || at < next_at)
            next_at = at;
    }
    return next_at;
}

/* The next notification to send: one given back, else one from the queue. */
static struct held *next_held(struct ctl_listen *l)
{
    struct held *h = l->back;
    if (h) {
        l->back = h->next;
        if (!l->back)
            l->back_tail = NULL;
        return h;
    }
    h = calloc(1, sizeof(*h)); /* before taking: a taken one must not vanish */
    if (!h) {
        xfer_err("listeners: out of memory: notifications wait in the queue");
        return NULL;
    }
    for (;;) {
        if (xfer_notif_poll(l->s->d->eng, &h->n, 1) != 1) {
            free(h);
            return NULL;
        }
        if (notify_tag_filter(&l->seen, h->n))
            return h;
        xfer_notif_free(h->n); /* a copy's stale attempt or a retry delivered already */
    }
}

static void listen_pump(struct ctl_server *s)
{
    struct ctl_listen *l = s->listen;
    if (!l)
        return;
    int64_t check_at = cut_stalled(l);
    bool blocked = false, drained = false;
    for (;;) {
        bool any = false;
        for (struct listener *x = l->head; x; x = x->next) {
            any |= active(x);
            blocked |= active(x) && !has_room(x);
        }
        if (!any || blocked)
            break;
        struct held *h = next_held(l);
        if (!h) {
            drained = true;
            break;
        }
        fan_out(l, h);
        check_at = cut_stalled(l);
    }
    /* the eventfd only while taking from the queue can go on: it stays
     * readable while the queue is not empty */
    arm(l, drained && !blocked);
    if (check_at) {
        int64_t in = check_at - xfer_now_ms() + 1;
        wake_in(l, in > 0 ? in : 1);
    }
}

void ctl_listen_free(struct ctl_server *s)
{
    struct ctl_listen *l = s->listen;
    if (!l)
        return;
    while (l->head)
        unlink_listener(l, l->head);
    size_t lost = 0;
    while (l->back) {
        struct held *h = l->back;
        l->back = h->next;
        xfer_notif_free(h->n);
        free(h);
        lost++;
    }
    if (lost)
        xfer_warn("control: %zu notification(s) taken for listeners and not acknowledged by any "
                  "are lost with this xferd",
                  lost);
    event_free(l->ev);
    event_free(l->timer);
    free(l);
    s->listen = NULL;
}
