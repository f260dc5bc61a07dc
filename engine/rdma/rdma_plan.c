/* Pure helpers of the rdma transport (see rdma_plan.h). */
#include "rdma_plan.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t xfer_rdma_chunk_count(uint64_t len, uint64_t chunk)
{
    if (len == 0)
        return 1;
    return (size_t)(len / chunk + (len % chunk != 0));
}

void xfer_rdma_chunk_at(uint64_t len, uint64_t chunk, size_t k, uint64_t *off, uint64_t *n)
{
    uint64_t o = (uint64_t)k * chunk;
    *off = o < len ? o : len;
    *n = len - *off < chunk ? len - *off : chunk;
}

int xfer_rdma_ring_init(struct xfer_rdma_ring *r, uint32_t cap)
{
    memset(r, 0, sizeof(*r));
    r->v = calloc(cap, sizeof(*r->v));
    if (!r->v)
        return -XFER_ENOMEM;
    r->cap = cap;
    return 0;
}

void xfer_rdma_ring_free(struct xfer_rdma_ring *r)
{
    free(r->v);
    memset(r, 0, sizeof(*r));
}

int xfer_rdma_ring_push(struct xfer_rdma_ring *r, const struct xfer_rdma_chunk *c)
{
    if (r->n == r->cap)
        return -XFER_ENOSPC;
    r->v[(r->head + r->n) % r->cap] = *c;
    r->n++;
    return 0;
}

static struct xfer_rdma_chunk *ring_at(struct xfer_rdma_ring *r, uint32_t i)
{
    return &r->v[(r->head + i) % r->cap];
}

size_t xfer_rdma_ring_complete(struct xfer_rdma_ring *r, uint64_t seq, enum ibv_wc_status st,
                               struct xfer_rdma_chunk *out, size_t max)
{
    uint32_t upto = 0;
    while (upto < r->n && ring_at(r, upto)->seq < seq)
        upto++;
    if (upto == r->n || ring_at(r, upto)->seq != seq)
        return 0; /* not ours (a CQE of an older incarnation) */
    if ((size_t)upto + 1 > max)
        return 0; /* caller's buffer is sized for the ring; never happens */
    const char *why = NULL;
    int status = xfer_rdma_wc_error(st, &why);
    for (uint32_t i = 0; i <= upto; i++) {
        out[i] = *ring_at(r, i);
        out[i].status = i == upto ? status : 0;
        out[i].why = i == upto ? why : NULL;
        out[i].retryable = i == upto && xfer_rdma_wc_retryable(st);
    }
    r->head = (r->head + upto + 1) % r->cap;
    r->n -= upto + 1;
    return (size_t)upto + 1;
}

size_t xfer_rdma_ring_drain(struct xfer_rdma_ring *r, int status, const char *why,
                            struct xfer_rdma_chunk *out, size_t max)
{
    size_t n = 0;
    while (r->n > 0 && n < max) {
        out[n] = *ring_at(r, 0);
        out[n].status = status;
        out[n].why = why;
        out[n].retryable = false;
        n++;
        r->head = (r->head + 1) % r->cap;
        r->n--;
    }
    return n;
}

int xfer_rdma_wc_error(enum ibv_wc_status st, const char **why)
{
    const char *w = NULL;
    int rc;
    switch (st) {
    case IBV_WC_SUCCESS:
        rc = 0;
        break;
    case IBV_WC_REM_ACCESS_ERR:
        rc = -XFER_EACCES;
        w = "remote access error (rkey, access mode or range refused by the target NIC)";
        break;
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_ACCESS_ERR:
        rc = -XFER_EIO;
        w = "local protection error (local buffer not registered or out of its region)";
        break;
    case IBV_WC_LOC_LEN_ERR:
        rc = -XFER_EIO;
        w = "local length error";
        break;
    case IBV_WC_WR_FLUSH_ERR:
        rc = -XFER_ECONN;
        w = "flushed: the queue pair went to error before this request ran";
        break;
    case IBV_WC_RETRY_EXC_ERR:
        rc = -XFER_ECONN;
        w = "transport retry counter exceeded (peer unreachable or dead)";
        break;
    case IBV_WC_RNR_RETRY_EXC_ERR:
        rc = -XFER_ECONN;
        w = "receiver not ready, retries exceeded";
        break;
    case IBV_WC_REM_INV_REQ_ERR:
        rc = -XFER_EPROTO;
        w = "remote invalid request (length or operation refused by the target)";
        break;
    case IBV_WC_REM_OP_ERR:
        rc = -XFER_EIO;
        w = "remote operation error";
        break;
    default:
        rc = -XFER_EIO;
        w = "RDMA completion error";
        break;
    }
    if (why)
        *why = w;
    return rc;
}

/* ---- NIC list ---- */

bool xfer_rdma_gid_ipv4(const union ibv_gid *gid, uint32_t *addr_be)
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (memcmp(gid->raw, prefix, sizeof(prefix)))
        return false;
    if (addr_be)
        memcpy(addr_be, &gid->raw[12], 4);
    return true;
}

int xfer_rdma_nics_append(char *buf, size_t len, const struct xfer_rdma_nic_desc *n)
{
    char gid[INET6_ADDRSTRLEN];
    if (!inet_ntop(AF_INET6, n->gid.raw, gid, sizeof(gid)))
        return -XFER_EINVAL;
    size_t used = strnlen(buf, len);
    int w = snprintf(buf + used, len - used, "%s%s,%u,%s,%s,%u,%s,%d,%u", used ? ";" : "", n->name,
                     n->port, gid, n->ib ? "ib" : "eth", n->gbps, n->pci[0] ? n->pci : "-", n->numa,
                     n->cm_port);
    if (w < 0 || (size_t)w >= len - used) {
        buf[used] = '\0';
        return -XFER_ENOSPC;
    }
    return 0;
}

static int parse_uint(const char *s, unsigned long max, unsigned long *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || end == s || *end || v > max || *s == '-')
        return -1;
    *out = v;
    return 0;
}

static int parse_one(char *e, struct xfer_rdma_nic_desc *n)
{
    char *f[8];
    int nf = 0;
    for (char *save = NULL, *tok = strtok_r(e, ",", &save); tok && nf < 8;
         tok = strtok_r(NULL, ",", &save))
        f[nf++] = tok;
    unsigned long port, gbps, cm;
    if (nf != 8 || strlen(f[0]) >= sizeof(n->name) || parse_uint(f[1], 255, &port) ||
        inet_pton(AF_INET6, f[2], n->gid.raw) != 1 || parse_uint(f[4], 1u << 20, &gbps) ||
        strlen(f[5]) >= sizeof(n->pci) || parse_uint(f[7], 65535, &cm))
        return -1;
    if (strcmp(f[3], "ib") && strcmp(f[3], "eth"))
        return -1;
    char *end;
    long numa = strtol(f[6], &end, 10);
    if (end == f[6] || *end || numa < -1 || numa > 4096)
        return -1;
    snprintf(n->name, sizeof(n->name), "%s", f[0]);
    n->port = (uint8_t)port;
    n->ib = !strcmp(f[3], "ib");
    n->gbps = (uint32_t)gbps;
    snprintf(n->pci, sizeof(n->pci), "%s", strcmp(f[5], "-") ? f[5] : "");
    n->numa = (int)numa;
    n->cm_port = (uint16_t)cm;
    return 0;
}

int xfer_rdma_nics_parse(const char *s, struct xfer_rdma_nic_desc *out, int max)
{
    if (!s)
        return -XFER_EPROTO;
    char copy[XFER_NICS_MAX];
    if (strlen(s) >= sizeof(copy))
        return -XFER_EPROTO;
    snprintf(copy, sizeof(copy), "%s", s);
    int n = 0;
    for (char *save = NULL, *e = strtok_r(copy, ";", &save); e; e = strtok_r(NULL, ";", &save)) {
        if (n == max || parse_one(e, &out[n]))
            return -XFER_EPROTO;
        n++;
    }
    return n;
}

int xfer_rdma_rkeys_format(const uint32_t *rkeys, int n, char *buf, size_t len)
{
    size_t used = 0;
    if (len == 0)
        return -XFER_ENOSPC;
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        int w = snprintf(buf + used, len - used, "%s%x", i ? "," : "", rkeys[i]);
        if (w < 0 || (size_t)w >= len - used)
            return -XFER_ENOSPC;
        used += (size_t)w;
    }
    return 0;
}

int xfer_rdma_rkeys_parse(const char *s, uint32_t *out, int max)
{
    int n = 0;
    if (!s || !*s)
        return 0;
    for (const char *p = s;;) {
        char *end;
        errno = 0;
        unsigned long v = strtoul(p, &end, 16);
        if (errno || end == p || v > 0xffffffffu || *p == '-' || n == max)
            return -XFER_EPROTO;
        out[n++] = (uint32_t)v;
        if (*end == '\0')
            return n;
        if (*end != ',')
            return -XFER_EPROTO;
        p = end + 1;
    }
}

static int path_split(const char *path, char *copy, size_t len, char **parts, int max)
{
    if (strlen(path) >= len)
        return -1;
    snprintf(copy, len, "%s", path);
    int n = 0;
    for (char *save = NULL, *t = strtok_r(copy, "/", &save); t; t = strtok_r(NULL, "/", &save)) {
        if (n == max)
            return -1;
        parts[n++] = t;
    }
    return n;
}

int xfer_rdma_pci_distance(const char *a, const char *b)
{
    enum { FAR = 1000, MAXP = 32 };
    char ca[512], cb[512], *pa[MAXP], *pb[MAXP];
    if (!a || !b)
        return FAR;
    int na = path_split(a, ca, sizeof(ca), pa, MAXP);
    int nb = path_split(b, cb, sizeof(cb), pb, MAXP);
    if (na < 0 || nb < 0)
        return FAR;
    int common = 0;
    while (common < na && common < nb && !strcmp(pa[common], pb[common]))
        common++;
    /* "sys", "devices", "pci0000:00": sharing less is sharing no root. */
    if (common < 3)
        return FAR;
    return (na - common) + (nb - common);
}
