/* xferctl notify / listen (docs/notify.md, docs/service.md): standalone
 * notifications from the local xferd, and the notifications arriving there,
 * printed one per line (--json: one object per line). */
#include "ctl_print.h"
#include "xferctl.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

int xctl_cmd_notify(const char *node, const char *text)
{
    Xctl__Notify m = XCTL__NOTIFY__INIT;
    m.node = (char *)node;
    m.text.data = (uint8_t *)text;
    m.text.len = strlen(text);
    m.deadline_ms = xctl_server_deadline();
    if (m.text.len > XFER_NOTIFY_MAX)
        return xctl_die(EXIT_USAGE, "notify: %zu bytes is over the limit of %u", m.text.len,
                        XFER_NOTIFY_MAX);
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_NOTIFY;
    req.notify = &m;
    Xctl__Response *r;
    int rc = xctl_call(&req, -1, &r);
    if (rc)
        return rc;
    xctl__response__free_unpacked(r, NULL);
    return 0;
}

/* JSON string of len bytes: valid UTF-8 as is (control characters
 * escaped), anything else byte by byte as \u00XX. */
static void json_bytes(FILE *f, const uint8_t *p, size_t len)
{
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        unsigned c = p[i];
        size_t n = c < 0x80             ? 0
                   : (c & 0xe0) == 0xc0 ? 1
                   : (c & 0xf0) == 0xe0 ? 2
                   : (c & 0xf8) == 0xf0 ? 3
                                        : 9;
        bool ok = n < 9 && i + n < len;
        for (size_t k = 1; ok && k <= n; k++)
            ok = (p[i + k] & 0xc0) == 0x80;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20 || c == 0x7f || (n && !ok))
            fprintf(f, "\\u%04x", c);
        else {
            fwrite(p + i, 1, n + 1, f);
            i += n;
        }
    }
    fputc('"', f);
}

static void print_notif(FILE *f, const Xctl__Notification *n, bool json)
{
    if (json) {
        fputs("{\"node\":", f);
        json_str(f, n->node);
        fprintf(f,
                ",\"incarnation\":\"%016" PRIx64 "\",\"seq\":%" PRIu64
                ",\"bound\":%s,\"status\":%d,\"error\":",
                n->incarnation, n->seq, n->bound ? "true" : "false", n->status);
        json_str(f, n->status ? xfer_strerror(n->status) : "");
        fprintf(f, ",\"items\":%u,\"failed_count\":%u,\"failed\":[", n->n_items, n->failed_count);
        for (size_t i = 0; i < n->n_failed; i++) {
            fprintf(f, "%s{\"index\":%u,\"status\":%d,\"error\":", i ? "," : "",
                    n->failed[i]->index, n->failed[i]->status);
            json_str(f, xfer_strerror(n->failed[i]->status));
            fputc('}', f);
        }
        fputs("],\"text\":", f);
        json_bytes(f, n->text.data, n->text.len);
        fputs("}\n", f);
        return;
    }
    fprintf(f, "from %s (incarnation %016" PRIx64 ", seq %" PRIu64 ") ", n->node, n->incarnation,
            n->seq);
    if (!n->bound)
        fputs("standalone: ", f);
    else if (!n->status)
        fprintf(f, "after a batch of %u item(s), all landed: ", n->n_items);
    else {
        fprintf(f, "after a batch of %u item(s), %u FAILED (", n->n_items, n->failed_count);
        for (size_t i = 0; i < n->n_failed && i < 8; i++)
            fprintf(f, "%sitem %u: %s", i ? ", " : "", n->failed[i]->index,
                    xfer_strerror(n->failed[i]->status));
        fputs(n->n_failed > 8 ? ", ...): " : "): ", f);
    }
    fwrite(n->text.data, 1, n->text.len, f);
    fputc('\n', f);
}

/* true when xferd already closed this subscription (it cut a stalled
 * listener): frames still buffered here were not acknowledged, xferd gives
 * them to the next listener, so they are not printed (docs/service.md). */
static bool server_hung_up(void)
{
    struct pollfd p = {.fd = ctl_fd(xctl_cli), .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP));
}

/* Tells xferd the first got notifications were printed. */
static int ack(uint64_t got, char *why, size_t wl)
{
    Xctl__ListenAck m = XCTL__LISTEN_ACK__INIT;
    m.count = got;
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_LISTEN_ACK;
    req.listen_ack = &m;
    return ctl_send(xctl_cli, &req, xctl_opt.timeout_ms, why, wl);
}

/* Waits for the next frame of the stream until deadline (-1: none). */
static int next_frame(int64_t deadline, Xctl__Response **r, char *why, size_t wl)
{
    struct pollfd p = {.fd = ctl_fd(xctl_cli), .events = POLLIN};
    for (;;) {
        int left = deadline < 0 ? 1000 : (int)(deadline - xfer_now_ms());
        if (deadline >= 0 && left <= 0)
            return -XFER_ETIMEDOUT;
        int n = poll(&p, 1, left);
        if (n > 0)
            break; /* a frame, or the connection closed: ctl_recv says which */
        if (n < 0 && errno != EINTR)
            return -XFER_ECONN;
    }
    return ctl_recv(xctl_cli, xctl_opt.timeout_ms, r, why, wl);
}

int xctl_cmd_listen(void)
{
    if (xctl_opt.count > UINT32_MAX)
        return xctl_die(EXIT_USAGE, "listen: --count too large");
    Xctl__Listen m = XCTL__LISTEN__INIT;
    m.count = (uint32_t)xctl_opt.count;
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_LISTEN;
    req.listen = &m;
    Xctl__Response *r;
    int rc = xctl_call(&req, -1, &r); /* the subscription's answer */
    if (rc)
        return rc;
    uint64_t id = r->id;
    xctl__response__free_unpacked(r, NULL);
    int64_t deadline = xctl_opt.timeout_set ? xfer_now_ms() + xctl_opt.timeout_ms : -1;
    uint64_t got = 0;
    char why[300];
    while (!m.count || got < m.count) {
        rc = next_frame(deadline, &r, why, sizeof(why));
        if (rc == -XFER_ETIMEDOUT && !m.count)
            return 0; /* listened for --timeout */
        if (rc == -XFER_ETIMEDOUT)
            return xctl_die(EXIT_FAIL,
                            "listen: %" PRIu64 " of %u notification(s) within %d ms (%s)", got,
                            m.count, xctl_opt.timeout_ms, xfer_strerror(rc));
        if (rc)
            return xctl_die(EXIT_FAIL, "listen: %s", why);
        if (r->status) {
            rc = xctl_die(EXIT_FAIL, "listen: %s (%s)", r->message ? r->message : "",
                          xfer_strerror(r->status));
            xctl__response__free_unpacked(r, NULL);
            return rc;
        }
        if (r->id == id && r->body_case == XCTL__RESPONSE__BODY_NOTIF) {
            if (server_hung_up()) {
                xctl__response__free_unpacked(r, NULL);
                return xctl_die(EXIT_FAIL,
                                "listen: xferd closed this subscription after %" PRIu64
                                " notification(s) (it cuts a listener that acknowledges "
                                "nothing for io_timeout_ms); the rest go to the next listener",
                                got);
            }
            print_notif(stdout, r->notif, xctl_opt.json);
            fflush(stdout);
            got++;
            rc = ack(got, why, sizeof(why));
        }
        xctl__response__free_unpacked(r, NULL);
        if (rc)
            return xctl_die(EXIT_FAIL, "listen: acknowledging: %s", why);
    }
    return 0;
}
