/* xferctl pools / pool-create / pool-delete / copy of pool blocks
 * (node/xfer_node.h "KV pools", docs/service.md). */
#include "ctl_print.h"
#include "xfer_node.h"
#include "xferctl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_pools(FILE *f, const Xctl__PoolList *pl, bool json)
{
    if (json)
        fputc('[', f);
    else
        fprintf(f, "%-14s %-12s %-6s %-11s %-8s %-6s %-3s %-6s %-14s %s\n", "POOL", "LAYOUT",
                "DTYPE", "BLOCK_BYTES", "BLOCKS", "LAYERS", "KV", "SHARD", "TAG", "REGIONS");
    for (size_t i = 0; i < pl->n_pools; i++) {
        const Xctl__Pool *p = pl->pools[i];
        if (json) {
            fprintf(f, "%s{\"node\":", i ? "," : "");
            json_str(f, p->node);
            fputs(",\"name\":", f);
            json_str(f, p->name);
            fputs(",\"layout\":", f);
            json_str(f, p->layout);
            fputs(",\"dtype\":", f);
            json_str(f, p->dtype);
            fprintf(f,
                    ",\"block_bytes\":%" PRIu64 ",\"num_blocks\":%" PRIu64
                    ",\"layers\":%u,\"kv\":%u,\"block_tokens\":%u,\"kv_heads\":%u,"
                    "\"head_dim\":%u,\"shard\":\"%u/%u\",\"tag\":",
                    p->block_bytes, p->num_blocks, p->layers, p->kv, p->block_tokens, p->kv_heads,
                    p->head_dim, p->shard_rank, p->shard_count);
            json_str(f, p->tag);
            fputs(",\"regions\":[", f);
            for (size_t k = 0; k < p->n_regions; k++) {
                fputs(k ? "," : "", f);
                json_str(f, p->regions[k]);
            }
            fputs("]}", f);
            continue;
        }
        char shard[24];
        snprintf(shard, sizeof(shard), "%u/%u", p->shard_rank, p->shard_count);
        fprintf(f, "%-14s %-12s %-6s %-11" PRIu64 " %-8" PRIu64 " %-6u %-3u %-6s %-14s ", p->name,
                p->layout, p->dtype, p->block_bytes, p->num_blocks, p->layers, p->kv, shard,
                *p->tag ? p->tag : "-");
        for (size_t k = 0; k < p->n_regions; k++)
            fprintf(f, "%s%s", k ? "," : "", p->regions[k]);
        fputc('\n', f);
    }
    if (json)
        fputs("]\n", f);
}

int xctl_cmd_pools(const char *node)
{
    Xctl__ListPools m = XCTL__LIST_POOLS__INIT;
    m.node = (char *)(node ? node : "");
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_POOLS;
    req.pools = &m;
    Xctl__Response *r;
    int rc = xctl_call(&req, -1, &r);
    if (rc)
        return rc;
    if (r->body_case == XCTL__RESPONSE__BODY_POOLS)
        print_pools(stdout, r->pools, xctl_opt.json);
    xctl__response__free_unpacked(r, NULL);
    return 0;
}

/* LAYOUT:DTYPE:BLOCK_BYTES:NUM_BLOCKS:LAYERS[:KV[:TAG]] (xfer_kv_geom_parse) */
int xctl_cmd_pool_create(const char *name, const char *spec)
{
    struct xfer_kv_geom g;
    char why[300];
    if (xfer_kv_geom_parse(spec, &g, why, sizeof(why)))
        return xctl_die(EXIT_USAGE, "%s", why);
    Xctl__Pool p = XCTL__POOL__INIT;
    p.name = (char *)name;
    p.layout = (char *)xfer_kv_layout_name(g.layout);
    p.dtype = g.dtype;
    p.block_bytes = g.block_bytes;
    p.num_blocks = g.num_blocks;
    p.layers = g.layers;
    p.kv = g.kv;
    p.shard_count = g.shard_count;
    p.tag = g.tag;
    Xctl__CreatePool m = XCTL__CREATE_POOL__INIT;
    m.pool = &p;
    m.access = (char *)(xctl_opt.access ? xctl_opt.access : "rw");
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_POOL_CREATE;
    req.pool_create = &m;
    Xctl__Response *r;
    int rc = xctl_call(&req, -1, &r);
    if (rc)
        return rc;
    if (r->body_case == XCTL__RESPONSE__BODY_POOL) {
        Xctl__Pool *one[1] = {r->pool};
        Xctl__PoolList pl = XCTL__POOL_LIST__INIT;
        pl.n_pools = 1;
        pl.pools = one;
        print_pools(stdout, &pl, xctl_opt.json);
    }
    xctl__response__free_unpacked(r, NULL);
    return 0;
}

int xctl_cmd_pool_delete(const char *name)
{
    Xctl__DeletePool m = XCTL__DELETE_POOL__INIT;
    m.name = (char *)name;
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_POOL_DELETE;
    req.pool_delete = &m;
    Xctl__Response *r;
    int rc = xctl_call(&req, -1, &r);
    if (!rc)
        xctl__response__free_unpacked(r, NULL);
    return rc;
}

/* "node/pool#7,19,3" or "node/pool#4-9,12": the address and the blocks
 * (malloc'ed). 0 or a usage error already printed. */
static int parse_blocks(const char *s, char *addr, size_t al, uint64_t **out, size_t *n)
{
    const char *hash = strchr(s, '#');
    *out = NULL;
    *n = 0;
    if (!hash || hash == s || (size_t)(hash - s) >= al || !strchr(s, '/') || !hash[1])
        return xctl_die(EXIT_USAGE, "bad pool blocks '%s' (want NODE/POOL#B1,B2,... )", s);
    memcpy(addr, s, (size_t)(hash - s));
    addr[hash - s] = 0;
    size_t cap = 0;
    for (const char *p = hash + 1;;) {
        char *end;
        if (*p < '0' || *p > '9')
            goto bad;
        uint64_t a = strtoull(p, &end, 10), b = a;
        if (*end == '-') {
            if (end[1] < '0' || end[1] > '9')
                goto bad;
            b = strtoull(end + 1, &end, 10);
        }
        if (b < a || b - a >= 65536 || *n + (b - a + 1) > 65536)
            goto bad;
        for (uint64_t v = a; v <= b; v++) {
            if (*n == cap) {
                cap = cap ? cap * 2 : 16;
                uint64_t *nv = realloc(*out, cap * sizeof(*nv));
                if (!nv) {
                    free(*out);
                    return xctl_die(EXIT_FAIL, "out of memory");
                }
                *out = nv;
            }
            (*out)[(*n)++] = v;
        }
        if (*end == 0)
            return 0;
        if (*end != ',')
            goto bad;
        p = end + 1;
    }
bad:
    free(*out);
    *out = NULL;
    return xctl_die(EXIT_USAGE,
                    "bad block list in '%s' (want block numbers like 7,19,3 or ranges 4-9; at "
                    "most 65536)",
                    s);
}

int xctl_cmd_pool_copy(const char *src, const char *dst)
{
    char sa[2 * XFER_NAME_MAX + 2], da[2 * XFER_NAME_MAX + 2];
    uint64_t *sb = NULL, *db = NULL;
    size_t ns = 0, nd = 0;
    uint32_t first = 0, nl = 0;
    int rc = parse_blocks(src, sa, sizeof(sa), &sb, &ns);
    if (!rc)
        rc = parse_blocks(dst, da, sizeof(da), &db, &nd);
    if (!rc && ns != nd)
        rc = xctl_die(EXIT_USAGE, "copy: %zu source blocks but %zu destination blocks", ns, nd);
    if (!rc && xctl_opt.layers) {
        char *end;
        const char *l = xctl_opt.layers;
        unsigned long a = strtoul(l, &end, 10), b = a;
        if (end != l && *end == '-' && end[1] >= '0' && end[1] <= '9')
            b = strtoul(end + 1, &end, 10);
        if (end == l || *end || *l < '0' || *l > '9' || b < a || b >= 65536)
            rc = xctl_die(EXIT_USAGE, "bad --layers '%s' (want A-B or A)", l);
        first = (uint32_t)a;
        nl = (uint32_t)(b - a + 1);
    }
    if (rc)
        goto out;
    Xctl__PoolCopy m = XCTL__POOL_COPY__INIT;
    m.src = sa;
    m.dst = da;
    m.src_blocks = sb;
    m.n_src_blocks = ns;
    m.dst_blocks = db;
    m.n_dst_blocks = nd;
    m.first_layer = first;
    m.nlayers = nl;
    m.deadline_ms = xctl_server_deadline();
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_POOL_COPY;
    req.pool_copy = &m;
    Xctl__Response *r;
    if ((rc = xctl_call(&req, -1, &r)) != 0)
        goto out;
    if (r->body_case == XCTL__RESPONSE__BODY_POOL_COPY) {
        const Xctl__PoolCopyResult *pc = r->pool_copy;
        if (xctl_opt.json) {
            printf("{\"src\":");
            json_str(stdout, sa);
            printf(",\"dst\":");
            json_str(stdout, da);
            printf(",\"blocks\":%zu,\"executor\":", ns);
            json_str(stdout, pc->executor);
            printf(",\"items\":%u,\"bytes\":%" PRIu64 ",\"elapsed_us\":%" PRIu64 ",\"transport\":",
                   pc->items, pc->bytes, pc->elapsed_us);
            json_str(stdout, pc->transport);
            printf("}\n");
        } else
            printf("copied %zu block(s) %s -> %s (by %s: %u item(s), %" PRIu64
                   " bytes, %s, %" PRIu64 " us)\n",
                   ns, sa, da, pc->executor, pc->items, pc->bytes,
                   *pc->transport ? pc->transport : "-", pc->elapsed_us);
    }
    xctl__response__free_unpacked(r, NULL);
out:
    free(sb);
    free(db);
    return rc;
}
