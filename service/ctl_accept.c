/*
 * Accepting control connections. The TCP handshake runs in the event loop
 * as a state machine (xfer_hs_server_step), so a silent client costs a file
 * descriptor and a timer, never a thread: it cannot hold up other clients.
 * Half-open connections are capped in all and per source address; over a
 * cap the oldest one is dropped (a client that completes its handshake in a
 * round trip is never the oldest), so a flood of silent connections cannot
 * lock out a real client, from another address or the same one.
 */
#include "ctl_conn.h"
#include "xfer_io.h"

#include <errno.h>
#include <event2/buffer.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <unistd.h>

#define ACCEPT_BURST   64
#define CAP_WARN_EVERY 10000 /* ms between two "cap reached" warnings */

static bool same_source(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family)
        return false;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                       &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr));
    return false;
}

void ctl_hs_forget(struct conn *c)
{
    if (!c->hs)
        return;
    struct ctl_server *s = c->s;
    xfer_hs_server_free(c->hs);
    c->hs = NULL;
    if (c->hs_timer)
        event_free(c->hs_timer);
    c->hs_timer = NULL;
    if (c->hs_prev)
        c->hs_prev->hs_next = c->hs_next;
    else
        s->hs_head = c->hs_next;
    if (c->hs_next)
        c->hs_next->hs_prev = c->hs_prev;
    else
        s->hs_tail = c->hs_prev;
    c->hs_prev = c->hs_next = NULL;
    s->nhalf--;
}

static void on_hs_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct conn *c = arg;
    xfer_debug("control: handshake timed out, closing");
    conn_close(c);
}

static void warn_cap(struct ctl_server *s, const char *which)
{
    int64_t now = xfer_now_ms();
    if (s->cap_warned_ms && now - s->cap_warned_ms < CAP_WARN_EVERY)
        return;
    s->cap_warned_ms = now;
    xfer_warn("control: %s reached: dropping the oldest connections that have not completed "
              "their handshake (silent clients?)",
              which);
}

/* Makes room for one more half-open connection from src. */
static void make_room(struct ctl_server *s, const struct sockaddr_storage *src)
{
    int same = 0;
    struct conn *oldest_same = NULL;
    for (struct conn *c = s->hs_head; c; c = c->hs_next)
        if (same_source(&c->src, src) && same++ == 0)
            oldest_same = c;
    if (same >= CTL_MAX_HALF_OPEN_PER_SOURCE) {
        warn_cap(s, "the cap on half-open control connections per source");
        conn_close(oldest_same);
    } else if (s->nhalf >= CTL_MAX_HALF_OPEN) {
        warn_cap(s, "the cap on half-open control connections");
        conn_close(s->hs_head);
    }
}

static void start_handshake(struct ctl_server *s, int fd, const struct sockaddr_storage *src)
{
    struct xferd *d = s->d;
    make_room(s, src);
    struct conn *c = conn_new(s, fd, false);
    if (!c)
        return;
    struct xfer_hs_self self = {.node_id = d->cfg.node, .incarnation = d->incarnation};
    if (d->cfg.secret[0]) {
        self.secret = d->cfg.secret;
        self.secret_len = strlen(d->cfg.secret);
    }
    c->src = *src;
    c->hs = xfer_hs_server_new(&self);
    c->hs_timer = evtimer_new(d->base, on_hs_timeout, c);
    int ms = d->cfg.connect_timeout_ms;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    if (!c->hs || !c->hs_timer || evtimer_add(c->hs_timer, &tv)) {
        xfer_err("control: out of memory for a handshake");
        xfer_hs_server_free(c->hs);
        c->hs = NULL;
        conn_close(c);
        return;
    }
    c->hs_prev = s->hs_tail;
    if (s->hs_tail)
        s->hs_tail->hs_next = c;
    else
        s->hs_head = c;
    s->hs_tail = c;
    s->nhalf++;
}

bool ctl_hs_frame(struct conn *c, const uint8_t *buf, size_t len)
{
    uint8_t out[XFER_HS_FRAME_MAX];
    int out_len = -1;
    struct xfer_hs_peer peer;
    char why[256] = "";
    int rc = xfer_hs_server_step(c->hs, buf, len, out, &out_len, &peer, why, sizeof(why));
    if (out_len >= 0)
        conn_send_raw(c, out, (size_t)out_len);
    if (c->dead)
        return false;
    if (rc == XFER_HS_MORE)
        return true;
    if (rc) {
        xfer_warn("control: handshake refused: %s", why);
        conn_close(c);
        return false;
    }
    ctl_hs_forget(c);
    xfer_debug("control: %s connected", peer.node_id);
    return conn_admit(c);
}

void ctl_on_accept(evutil_socket_t lfd, short what, void *arg)
{
    (void)what;
    struct ctl_server *s = arg;
    bool is_unix = lfd == s->unix_fd;
    for (int i = 0; i < ACCEPT_BURST && s->accepting; i++) {
        struct sockaddr_storage src = {0};
        socklen_t sl = sizeof(src);
        int fd = accept4(lfd, (struct sockaddr *)&src, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE)
                xfer_warn("control: cannot accept: %s", strerror(errno));
            return;
        }
        if (is_unix) {
            struct conn *c = conn_new(s, fd, true);
            if (c)
                conn_admit(c);
            continue;
        }
        int one = 1; /* small request/response frames: no Nagle delay */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        start_handshake(s, fd, &src);
    }
}
