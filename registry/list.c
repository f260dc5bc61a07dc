/* Listings: all live nodes, all regions of a node. One pipelined round trip
 * per level; expired rows are skipped silently, malformed ones with a warning. */
#include <stdlib.h>
#include <string.h>

#include "reg_internal.h"

static int cmp_node(const void *a, const void *b)
{
    return strcmp(((const struct xfer_node_desc *)a)->peer.node_id,
                  ((const struct xfer_node_desc *)b)->peer.node_id);
}

static int cmp_region(const void *a, const void *b)
{
    return strcmp(((const struct xfer_region_desc *)a)->name,
                  ((const struct xfer_region_desc *)b)->name);
}

/* Appends HGETALL <key of name i> for each valid name of a string array
 * reply; returns how many were appended, valid[i] says which. */
static size_t append_hgetalls(xfer_registry *r, const redisReply *names, const char *node,
                              bool *valid)
{
    size_t k = 0;
    for (size_t i = 0; i < names->elements; i++) {
        const redisReply *e = names->element[i];
        valid[i] = e->type == REDIS_REPLY_STRING && xfer_registry_name_ok(e->str);
        if (!valid[i]) {
            xfer_warn("registry: skipping bad name '%.64s' in %s", e->str ? e->str : "?",
                      node ? "a region set" : REG_NODES_KEY);
            continue;
        }
        char key[REG_KEY_MAX];
        if (node)
            reg_key_region(key, node, e->str);
        else
            reg_key_node(key, e->str);
        const char *argv[] = {"HGETALL", key};
        reg_append(r, 2, argv, NULL);
        k++;
    }
    return k;
}

/* Reads the HGETALL replies of append_hgetalls and parses each into
 * out (node or region array, sized for every name); returns rows kept. */
static int read_rows(xfer_registry *r, const redisReply *names, const char *node, const bool *valid,
                     void *out, size_t *kept)
{
    *kept = 0;
    for (size_t i = 0; i < names->elements; i++) {
        if (!valid[i])
            continue;
        redisReply *rep;
        int rc = reg_read_replies(r, 1, &rep);
        if (rc)
            return rc;
        const char *name = names->element[i]->str;
        rc = reg_reply_check(rep, "HGETALL");
        if (!rc && node)
            rc = reg_parse_region(rep, node, name, (struct xfer_region_desc *)out + *kept);
        else if (!rc)
            rc = reg_parse_node(rep, name, (struct xfer_node_desc *)out + *kept);
        freeReplyObject(rep);
        if (!rc)
            (*kept)++;
        else if (rc != -XFER_ENOENT) /* ENOENT: expired, not worth a warning */
            xfer_warn("registry: skipping row: %s", xfer_registry_last_error(r));
    }
    return 0;
}

/* Cluster mode: ZRANGE of every membership shard, merged into one array
 * reply (*names, to free). */
static int shard_members(xfer_registry *r, redisReply **names)
{
    char key[REG_KEY_MAX];
    redisReply *part[REG_SHARDS];
    int rc = reg_conn_ensure(r);
    if (rc)
        return rc;
    for (unsigned s = 0; s < REG_SHARDS; s++) {
        reg_key_shard(key, s);
        const char *argv[] = {"ZRANGE", key, "0", "-1"};
        reg_append(r, 4, argv, NULL);
    }
    if ((rc = reg_read_replies(r, REG_SHARDS, part)))
        return rc;
    size_t total = 0;
    for (unsigned s = 0; s < REG_SHARDS; s++)
        if (!rc && !(rc = reg_reply_check(part[s], "ZRANGE")))
            total += part[s]->type == REDIS_REPLY_ARRAY ? part[s]->elements : 0;
    redisReply *m = rc ? NULL : calloc(1, sizeof(*m));
    if (m && !(m->element = calloc(total ? total : 1, sizeof(*m->element)))) {
        free(m);
        m = NULL;
    }
    for (unsigned s = 0; s < REG_SHARDS; s++) {
        for (size_t i = 0; m && part[s]->type == REDIS_REPLY_ARRAY && i < part[s]->elements; i++)
            m->element[m->elements++] = part[s]->element[i]; /* moved into m */
        if (m && part[s]->type == REDIS_REPLY_ARRAY)
            part[s]->elements = 0;
        freeReplyObject(part[s]);
    }
    if (!m)
        return rc ? rc : reg_set_err(-XFER_ENOMEM, "out of memory listing nodes");
    m->type = REDIS_REPLY_ARRAY;
    *names = m;
    return 0;
}

/* Runs cmd (a listing of names; argc 0: the membership shards), then
 * HGETALL for every name; cmd_lock held. */
static int fetch_rows(xfer_registry *r, int argc, const char **argv, const char *node, size_t elem,
                      void **out, size_t *n)
{
    redisReply *names;
    int rc = argc ? reg_cmd(r, &names, argc, argv, NULL) : shard_members(r, &names);
    if (rc)
        return rc;
    if ((rc = reg_reply_check(names, argv[0])) || names->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(names);
        return rc ? rc : reg_set_err(-XFER_EPROTO, "%s: unexpected reply type", argv[0]);
    }
    size_t cnt = names->elements;
    bool *valid = calloc(cnt ? cnt : 1, sizeof(*valid));
    *out = calloc(cnt ? cnt : 1, elem);
    if (!valid || !*out) {
        rc = reg_set_err(-XFER_ENOMEM, "out of memory listing %s", argv[1]);
    } else {
        append_hgetalls(r, names, node, valid);
        rc = read_rows(r, names, node, valid, *out, n);
    }
    free(valid);
    freeReplyObject(names);
    if (rc) {
        free(*out);
        *out = NULL;
    }
    return rc;
}

int xfer_registry_list_nodes(xfer_registry *r, struct xfer_node_desc **out, size_t *n)
{
    if (!r || !out || !n)
        return -XFER_EINVAL;
    *out = NULL;
    *n = 0;
    const char *argv[] = {"ZRANGE", REG_NODES_KEY, "0", "-1"};
    void *rows = NULL;
    pthread_mutex_lock(&r->cmd_lock);
    int rc = fetch_rows(r, r->cl ? 0 : 4, argv, NULL, sizeof(struct xfer_node_desc), &rows, n);
    pthread_mutex_unlock(&r->cmd_lock);
    if (rc)
        return rc;
    struct xfer_node_desc *v = rows;
    for (size_t i = 0; i < *n; i++)
        reg_cache_store_node(r, &v[i]);
    qsort(v, *n, sizeof(*v), cmp_node);
    if (*n == 0) {
        free(v);
        v = NULL;
    }
    *out = v;
    return 0;
}

int xfer_registry_list_regions(xfer_registry *r, const char *node_id, struct xfer_region_desc **out,
                               size_t *n)
{
    if (!r || !out || !n)
        return -XFER_EINVAL;
    *out = NULL;
    *n = 0;
    struct xfer_node_desc nd;
    int rc = xfer_registry_fetch_node(r, node_id, &nd); /* ENOENT names the node */
    if (rc)
        return rc;
    char set[REG_KEY_MAX];
    reg_key_regions(set, node_id);
    const char *argv[] = {"SMEMBERS", set};
    void *rows = NULL;
    pthread_mutex_lock(&r->cmd_lock);
    rc = fetch_rows(r, 2, argv, node_id, sizeof(struct xfer_region_desc), &rows, n);
    pthread_mutex_unlock(&r->cmd_lock);
    if (rc)
        return rc;
    struct xfer_region_desc *v = rows;
    reg_cache_store_regions(r, node_id, nd.peer.incarnation, v, *n);
    qsort(v, *n, sizeof(*v), cmp_region);
    if (*n == 0) {
        free(v);
        v = NULL;
    }
    *out = v;
    return 0;
}
