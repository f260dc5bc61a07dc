/*
 * Notification listeners (xferctl listen): control connections subscribed
 * with a Listen request get every notification that arrives at this xferd's
 * engine, as Response{id, notif} frames. Runs on the loop thread only.
 *
 * Nothing is dropped silently: notifications stay in the engine's bounded
 * queue (senders see -XFER_ENOSPC when it is full) until at least one
 * listener is subscribed; one taken from the queue is written to every
 * listener subscribed at that moment. A listener that asked for `count` gets
 * no more than that, and no more is taken than the smallest count left, so
 * the rest wait in the queue for the next listener. A slow listener (replies
 * unread past LISTEN_OUT_HIGH) pauses the taking for everyone (back-pressure
 * to the senders) for at most io_timeout_ms, then it is disconnected with a
 * warn line; a listener that goes away is dropped with its connection.
 */
#include "ctl_conn.h"
#include "xfer_io.h"

#include <event2/buffer.h>
#include <stdlib.h>
#include <string.h>

#define LISTEN_MAX      64         /* listeners per xferd */
#define LISTEN_OUT_HIGH (1u << 20) /* unread reply bytes that make one slow */
#define LISTEN_TAKE_MAX 64         /* notifications taken per round */
#define LISTEN_RETRY_MS 20         /* re-check of a paused fan-out */

struct listener {
    struct conn *c;
    uint64_t id;
    uint32_t left;         /* notifications still to send; 0 = no limit */
    int64_t slow_since_ms; /* 0 = keeping up */
    struct listener *next;
};

struct ctl_listen {
    struct ctl_server *s;
    struct event *ev;    /* the engine's notification eventfd */
    struct event *timer; /* retry while paused */
    struct listener *head;
    int n;
    bool armed;
};

static void listen_pump(struct ctl_server *s);

static void on_notif_fd(evutil_socket_t fd, short what, void *arg)
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
    l->ev = event_new(s->d->base, xfer_notif_fd(s->d->eng), EV_READ | EV_PERSIST, on_notif_fd, s);
    l->timer = evtimer_new(s->d->base, on_notif_fd, s);
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

static void unlink_listener(struct ctl_listen *l, struct listener *x)
{
    for (struct listener **pp = &l->head; *pp; pp = &(*pp)->next)
        if (*pp == x) {
            *pp = x->next;
            break;
        }
    x->c->listening = false;
    l->n--;
    free(x);
    if (!l->head)
        arm(l, false);
}

void ctl_listen_drop(struct conn *c)
{
    struct ctl_listen *l = c->s->listen;
    if (!l || !c->listening)
        return;
    for (struct listener *x = l->head; x; x = x->next)
        if (x->c == c) {
            unlink_listener(l, x);
            return;
        }
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
    x->left = count;
    x->next = l->head;
    l->head = x;
    l->n++;
    c->listening = true;
    Xctl__Response r = XCTL__RESPONSE__INIT;
    r.id = id; /* status 0, no body: subscribed */
    send_resp(c, &r);
    if (!c->dead)
        listen_pump(c->s); /* what waits in the queue goes out now */
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

/* Sends n to every listener; those whose count is used up are dropped. */
static void fan_out(struct ctl_listen *l, const struct xfer_notif *n)
{
    Xctl__FailedItem *fi = calloc(n->n_listed + 1, sizeof(*fi));
    Xctl__FailedItem **fp = calloc(n->n_listed + 1, sizeof(*fp));
    Xctl__Notification m;
    if (!fi || !fp) {
        xfer_err("listeners: out of memory: a notification from %s was not delivered", n->node_id);
        free(fi);
        free(fp);
        return;
    }
    notif_msg(n, &m, fi, fp);
    for (struct listener *x = l->head, *next; x; x = next) {
        next = x->next;
        struct conn *c = x->c;
        Xctl__Response r = XCTL__RESPONSE__INIT;
        r.id = x->id;
        r.body_case = XCTL__RESPONSE__BODY_NOTIF;
        r.notif = &m;
        if (x->left && --x->left == 0)
            unlink_listener(l, x); /* done: later ones stay queued */
        c->refs++;                 /* a failed send closes c, which must outlive this loop */
        send_resp(c, &r);
        conn_put(c);
    }
    free(fi);
    free(fp);
}

/* true when every listener keeps up; disconnects one slow for too long. */
static bool listeners_ready(struct ctl_listen *l)
{
    bool ready = true;
    int64_t now = xfer_now_ms(), limit = l->s->d->cfg.io_timeout_ms;
    for (struct listener *x = l->head, *next; x; x = next) {
        next = x->next;
        if (evbuffer_get_length(x->c->out) < LISTEN_OUT_HIGH) {
            x->slow_since_ms = 0;
            continue;
        }
        if (!x->slow_since_ms)
            x->slow_since_ms = now;
        if (now - x->slow_since_ms > limit) {
            xfer_warn("control: a notification listener left %zu bytes unread for over %lld ms: "
                      "disconnected",
                      evbuffer_get_length(x->c->out), (long long)limit);
            conn_close(x->c); /* drops x */
            continue;
        }
        ready = false;
    }
    return ready;
}

static void listen_pump(struct ctl_server *s)
{
    struct ctl_listen *l = s->listen;
    if (!l)
        return;
    while (l->head) {
        if (!listeners_ready(l)) {
            arm(l, false);
            struct timeval tv = {0, LISTEN_RETRY_MS * 1000};
            evtimer_add(l->timer, &tv);
            return;
        }
        if (!l->head)
            break;
        size_t max = LISTEN_TAKE_MAX;
        for (struct listener *x = l->head; x; x = x->next)
            if (x->left && x->left < max)
                max = x->left;
        struct xfer_notif *got[LISTEN_TAKE_MAX];
        int n = xfer_notif_poll(s->d->eng, got, max);
        for (int i = 0; i < n; i++) {
            if (l->head)
                fan_out(l, got[i]);
            else /* cannot happen: max is the smallest count left */
                xfer_err("listeners: a notification from %s had no listener left", got[i]->node_id);
            xfer_notif_free(got[i]);
        }
        if (n < (int)max)
            break; /* queue empty */
    }
    arm(l, l->head != NULL);
}

void ctl_listen_free(struct ctl_server *s)
{
    struct ctl_listen *l = s->listen;
    if (!l)
        return;
    while (l->head)
        unlink_listener(l, l->head);
    event_free(l->ev);
    event_free(l->timer);
    free(l);
    s->listen = NULL;
}
