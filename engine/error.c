/* Error codes and the small text parsers shared by every layer. */
#include "xfer.h"

#include <stdio.h>
#include <string.h>

static const char *const err_text[XFER_ERR_MAX] = {
    [XFER_OK] = "success",
    [XFER_EINVAL] = "invalid argument",
    [XFER_ENOMEM] = "out of memory",
    [XFER_ENOENT] = "no such node, region or item",
    [XFER_EACCES] = "access denied by the region's access mode",
    [XFER_ERANGE] = "offset or length outside the region",
    [XFER_ESTALE] = "stale: region generation, peer incarnation, or a lease that ended",
    [XFER_ETIMEDOUT] = "timed out",
    [XFER_ECANCELED] = "cancelled",
    [XFER_ECONN] = "connection failed or lost",
    [XFER_EPROTO] = "protocol error (malformed or unexpected message)",
    [XFER_EAUTH] = "authentication failed",
    [XFER_EIO] = "I/O or device error",
    [XFER_ENOTSUP] = "not supported",
    [XFER_EINPROGRESS] = "in progress",
    [XFER_ENODEV] = "no such device",
    [XFER_EEXIST] = "name already in use",
    [XFER_EBUSY] = "resource busy",
    [XFER_EMISMATCH] = "layouts disagree",
    [XFER_ENOSPC] = "capacity exhausted",
    [XFER_EUNAVAIL] = "service unavailable",
    [XFER_ETRUNC] = "message longer than the receive buffer",
};

const char *xfer_strerror(int err)
{
    if (err < 0)
        err = -err;
    if (err >= XFER_ERR_MAX || !err_text[err])
        return "unknown error";
    return err_text[err];
}

struct transport_name {
    const char *name;
    unsigned bit;
};

/* Preference order: the fastest mechanism that reaches a peer first. */
static const struct transport_name transport_names[] = {
    {"ipc", XFER_TRANSPORT_IPC},
    {"rdma", XFER_TRANSPORT_RDMA},
    {"tcpx", XFER_TRANSPORT_TCPX},
    {"tcp", XFER_TRANSPORT_TCP},
};
#define N_TRANSPORTS (sizeof(transport_names) / sizeof(transport_names[0]))

int xfer_transports_parse(const char *list, unsigned *mask)
{
    if (!list || !mask)
        return -XFER_EINVAL;
    unsigned m = 0;
    const char *p = list;
    while (*p) {
        size_t n = strcspn(p, ", ");
        if (n == 3 && !strncmp(p, "all", 3)) {
            m |= XFER_TRANSPORT_ALL;
        } else if (n > 0) {
            size_t i;
            for (i = 0; i < N_TRANSPORTS; i++)
                if (strlen(transport_names[i].name) == n && !strncmp(p, transport_names[i].name, n))
                    break;
            if (i == N_TRANSPORTS)
                return -XFER_EINVAL;
            m |= transport_names[i].bit;
        }
        p += n;
        p += strspn(p, ", ");
    }
    *mask = m;
    return 0;
}

int xfer_transports_format(unsigned mask, char *buf, size_t len)
{
    if (!buf || len == 0)
        return -XFER_EINVAL;
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < N_TRANSPORTS; i++) {
        if (!(mask & transport_names[i].bit))
            continue;
        int n = snprintf(buf + used, len - used, "%s%s", used ? "," : "", transport_names[i].name);
        if (n < 0 || (size_t)n >= len - used)
            return -XFER_ENOSPC;
        used += (size_t)n;
    }
    return 0;
}

int xfer_access_parse(const char *s, unsigned *mask)
{
    if (!s || !mask)
        return -XFER_EINVAL;
    if (!strcmp(s, "r"))
        *mask = XFER_ACCESS_R;
    else if (!strcmp(s, "w"))
        *mask = XFER_ACCESS_W;
    else if (!strcmp(s, "rw") || !strcmp(s, "wr"))
        *mask = XFER_ACCESS_RW;
    else
        return -XFER_EINVAL;
    return 0;
}

const char *xfer_access_str(unsigned mask)
{
    switch (mask & XFER_ACCESS_RW) {
    case XFER_ACCESS_R:
        return "r";
    case XFER_ACCESS_W:
        return "w";
    case XFER_ACCESS_RW:
        return "rw";
    default:
        return "-";
    }
}
