/* xferctl commands that move data in bulk or measure: put/get through a
 * memfd staging region, batch, probe and bench. */
#include "ctl_print.h"
#include "xfer_node.h"
#include "progress.h"
#include "xferctl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Lines "SRC DST LEN" (from FILE or stdin) submitted as one batch. */
int xctl_cmd_batch(const char *file)
{
    FILE *f = strcmp(file, "-") ? fopen(file, "r") : stdin;
    if (!f)
        return xctl_die(EXIT_FAIL, "%s: %s", file, strerror(errno));
    Xctl__Transfer *items = calloc(4096, sizeof(*items));
    Xctl__Transfer **ptrs = calloc(4096, sizeof(*ptrs));
    char line[512];
    size_t n = 0;
    int rc = items && ptrs ? 0 : xctl_die(EXIT_FAIL, "out of memory");
    Xctl__Op op = xctl_parse_op();
    while (!rc && fgets(line, sizeof(line), f)) {
        char src[200], dst[200], lens[64];
        if (line[0] == '#' || strspn(line, " \t\n") == strlen(line))
            continue;
        if (n == 4096 || sscanf(line, "%199s %199s %63s", src, dst, lens) != 3) {
            rc = xctl_die(EXIT_USAGE, "batch line %zu: want 'SRC DST LEN' (at most 4096 lines)",
                          n + 1);
            break;
        }
        xctl__transfer__init(&items[n]);
        items[n].op = op;
        items[n].src = strdup(src);
        items[n].dst = strdup(dst);
        rc = xctl_parse_len(lens, &items[n].len);
        ptrs[n] = &items[n];
        n++;
    }
    if (f != stdin)
        fclose(f);
    if (!rc && n == 0)
        rc = xctl_die(EXIT_USAGE, "empty batch");
    if (!rc) {
        Xctl__SubmitBatch b = XCTL__SUBMIT_BATCH__INIT;
        b.n_items = n;
        b.items = ptrs;
        b.deadline_ms = xctl_server_deadline();
        if (xctl_opt.notify) {
            b.notify.data = (uint8_t *)xctl_opt.notify;
            b.notify.len = strlen(xctl_opt.notify);
        }
        Xctl__Request req = XCTL__REQUEST__INIT;
        req.body_case = XCTL__REQUEST__BODY_BATCH;
        req.batch = &b;
        Xctl__Response *r = NULL;
        char why[400];
        rc = ctl_call(xctl_cli, &req, -1, xctl_opt.timeout_ms, &r, why, sizeof(why));
        if (rc)
            rc = xctl_die(EXIT_FAIL, "%s", why);
        else if (r->body_case == XCTL__RESPONSE__BODY_BATCH)
            print_batch(stdout, r->batch, xctl_opt.json);
        if (!rc && !r->status && xctl_opt.notify && !xctl_opt.json)
            printf("notification delivered to every remote node of the batch\n");
        if (!rc && r->status)
            rc = xctl_die(EXIT_FAIL, "%s (%s)", r->message, xfer_strerror(r->status));
        if (r)
            xctl__response__free_unpacked(r, NULL);
    }
    for (size_t i = 0; i < n; i++) {
        free(items[i].src);
        free(items[i].dst);
    }
    free(items);
    free(ptrs);
    return rc;
}

/* Staging for put/get: a memfd shared with the local xferd as a private
 * region, so file bytes cross the unix socket only as a mapping. */
struct stage {
    char name[64], addr[XFER_NAME_MAX * 2 + 8];
    int fd;
    uint8_t *map;
    uint64_t len;
};

static int stage_open(struct stage *s, const char *what, uint64_t want)
{
    if (xctl_opt.connect)
        return xctl_die(EXIT_USAGE,
                        "%s needs a local xferd's unix socket (--socket or --node), "
                        "not --connect",
                        what);
    Xctl__Response *r;
    int rc = xctl_get_health(&r);
    if (rc)
        return rc;
    s->len = want < 4096 ? 4096 : want > STAGE_MAX ? STAGE_MAX : want;
    snprintf(s->name, sizeof(s->name), "_%s.%d", what, (int)getpid());
    snprintf(s->addr, sizeof(s->addr), "%s/%s", r->health->node, s->name);
    xctl__response__free_unpacked(r, NULL);
    s->fd = memfd_create("xferctl-stage", MFD_CLOEXEC | MFD_ALLOW_SEALING); /* xferd seals it */
    if (s->fd < 0 || ftruncate(s->fd, (off_t)s->len))
        return xctl_die(EXIT_FAIL, "staging memfd: %s", strerror(errno));
    s->map = mmap(NULL, s->len, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    if (s->map == MAP_FAILED) {
        s->map = NULL;
        return xctl_die(EXIT_FAIL, "staging mmap: %s", strerror(errno));
    }
    return xctl_register(s->name, s->len, "rw", s->fd, true);
}

static void stage_close(struct stage *s, bool registered)
{
    if (registered)
        xctl_deregister(s->name);
    if (s->map)
        munmap(s->map, s->len);
    if (s->fd >= 0)
        close(s->fd);
}

static int byte_addr(const char *addr, struct xfer_node_addr *n)
{
    char why[200];
    if (xfer_node_addr_parse(addr, n, why, sizeof(why)))
        return xctl_die(EXIT_USAGE, "%s", why);
    if (n->is_block)
        return xctl_die(EXIT_USAGE, "put/get take a byte address (NODE/REGION+OFF)");
    return 0;
}

int xctl_cmd_put(const char *file, const char *addr)
{
    struct xfer_node_addr n;
    int rc = byte_addr(addr, &n);
    if (rc)
        return rc;
    int ffd = open(file, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (ffd < 0 || fstat(ffd, &st)) {
        rc = xctl_die(EXIT_FAIL, "%s: %s", file, strerror(errno));
        if (ffd >= 0)
            close(ffd);
        return rc;
    }
    struct stage s = {.fd = -1};
    rc = stage_open(&s, "put", (uint64_t)st.st_size);
    bool reg = rc == 0;
    struct progress p;
    progress_start(&p, "put", (uint64_t)st.st_size, 4u << 20);
    for (uint64_t off = 0; !rc && off < (uint64_t)st.st_size;) {
        uint64_t len = (uint64_t)st.st_size - off < s.len ? (uint64_t)st.st_size - off : s.len;
        ssize_t got = pread(ffd, s.map, len, (off_t)off);
        if (got <= 0) {
            rc = xctl_die(EXIT_FAIL, "%s: %s", file,
                          got < 0 ? strerror(errno) : "shrank while reading");
            break;
        }
        char dst[XFER_NAME_MAX * 2 + 32];
        snprintf(dst, sizeof(dst), "%s/%s+%" PRIu64, n.node, n.region, n.off + off);
        rc = xctl_transfer(s.addr, dst, (uint64_t)got, XCTL__OP__OP_AUTO, 0, false, NULL, NULL);
        off += (uint64_t)got;
        progress_add(&p, (uint64_t)got);
    }
    progress_end(&p);
    stage_close(&s, reg);
    close(ffd);
    return rc;
}

int xctl_cmd_get(const char *addr, const char *lens, const char *file)
{
    struct xfer_node_addr n;
    uint64_t total;
    int rc = byte_addr(addr, &n) ? EXIT_USAGE : xctl_parse_len(lens, &total);
    if (rc)
        return rc;
    int ffd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (ffd < 0)
        return xctl_die(EXIT_FAIL, "%s: %s", file, strerror(errno));
    struct stage s = {.fd = -1};
    rc = stage_open(&s, "get", total);
    bool reg = rc == 0;
    struct progress p;
    progress_start(&p, "get", total, 4u << 20);
    for (uint64_t off = 0; !rc && off < total;) {
        uint64_t len = total - off < s.len ? total - off : s.len;
        char src[XFER_NAME_MAX * 2 + 32];
        snprintf(src, sizeof(src), "%s/%s+%" PRIu64, n.node, n.region, n.off + off);
        rc = xctl_transfer(src, s.addr, len, XCTL__OP__OP_AUTO, 0, false, NULL, NULL);
        if (!rc && pwrite(ffd, s.map, len, (off_t)off) != (ssize_t)len)
            rc = xctl_die(EXIT_FAIL, "%s: %s", file, strerror(errno));
        off += len;
        progress_add(&p, len);
    }
    progress_end(&p);
    stage_close(&s, reg);
    if (close(ffd) && !rc)
        rc = xctl_die(EXIT_FAIL, "%s: %s", file, strerror(errno));
    if (rc)
        unlink(file);
    return rc;
}

int xctl_cmd_probe(const char *src, const char *dst)
{
    int rc = xctl_check_addr(src) || xctl_check_addr(dst) ? EXIT_USAGE : 0;
    uint64_t size = xctl_opt.size ? xctl_opt.size : 1u << 20, small = size < 4096 ? size : 4096;
    uint32_t n = xctl_opt.count ? (uint32_t)xctl_opt.count : 20;
    Xctl__Response *lat = NULL, *bw = NULL;
    if (rc || (rc = xctl_transfer(src, dst, small, xctl_parse_op(), n * 5, false, NULL, &lat)) ||
        (rc = xctl_transfer(src, dst, size, xctl_parse_op(), n, false, NULL, &bw))) {
        if (lat)
            xctl__response__free_unpacked(lat, NULL);
        return rc;
    }
    const Xctl__ItemResult *l = lat->batch->items[0], *b = bw->batch->items[0];
    char hb[32], hr[32];
    double secs = (double)b->elapsed_us / 1e6;
    printf("probe %s -> %s (executed by %s)\n", src, dst, l->executor);
    printf("  latency   %.1f us per %" PRIu64 "-byte transfer (%u transfers)\n",
           (double)l->elapsed_us / (n * 5), small, n * 5);
    printf("  bandwidth %s/s (%u x %s in %.3f s)\n",
           human_bytes(secs > 0 ? (double)b->bytes / secs : 0, hr, sizeof(hr)), n,
           human_bytes((double)size, hb, sizeof(hb)), secs);
    xctl__response__free_unpacked(lat, NULL);
    xctl__response__free_unpacked(bw, NULL);
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Pipelined small named transfers: depth requests in flight, each a batch. */
int xctl_cmd_bench(const char *src, const char *dst)
{
    uint64_t count = xctl_opt.count ? xctl_opt.count : 10000,
             size = xctl_opt.size ? xctl_opt.size : 64;
    uint64_t depth = xctl_opt.depth ? xctl_opt.depth : 16,
             per = xctl_opt.batch ? xctl_opt.batch : 1;
    int rc = xctl_check_addr(src) || xctl_check_addr(dst) ? EXIT_USAGE : 0;
    if (rc)
        return rc;
    if (per > 4096)
        return xctl_die(EXIT_USAGE, "--batch is at most 4096");
    uint64_t nreq = (count + per - 1) / per;
    Xctl__Transfer t = XCTL__TRANSFER__INIT;
    t.src = (char *)src;
    t.dst = (char *)dst;
    t.len = size;
    Xctl__Transfer **items = calloc(per, sizeof(*items));
    int64_t *sent = calloc(nreq, sizeof(*sent));
    uint64_t *lat = calloc(nreq, sizeof(*lat));
    if (!items || !sent || !lat) {
        free(items), free(sent), free(lat);
        return xctl_die(EXIT_FAIL, "out of memory");
    }
    for (uint64_t i = 0; i < per; i++)
        items[i] = &t;
    Xctl__SubmitBatch b = XCTL__SUBMIT_BATCH__INIT;
    b.items = items;
    b.deadline_ms = xctl_server_deadline();
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_BATCH;
    req.batch = &b;
    char why[400];
    uint64_t issued = 0, done = 0, failed = 0, first_id = 0;
    int64_t t0 = xfer_now_ms();
    while (!rc && done < nreq) {
        while (issued < nreq && issued - done < depth) {
            b.n_items = issued == nreq - 1 && count % per ? count % per : per;
            if ((rc = ctl_send(xctl_cli, &req, xctl_opt.timeout_ms, why, sizeof(why))) != 0)
                break;
            if (issued == 0)
                first_id = req.id;
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            sent[issued++] = ts.tv_sec * 1000000000LL + ts.tv_nsec;
        }
        Xctl__Response *r = NULL;
        if (rc || (rc = ctl_recv(xctl_cli, xctl_opt.timeout_ms, &r, why, sizeof(why))) != 0)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t k = r->id - first_id;
        if (k < nreq)
            lat[done] = (uint64_t)(ts.tv_sec * 1000000000LL + ts.tv_nsec - sent[k]) / 1000;
        if (r->status && failed++ == 0)
            fprintf(stderr, "xferctl: bench: first failure: %s\n", r->message);
        done++;
        xctl__response__free_unpacked(r, NULL);
    }
    double secs = (double)(xfer_now_ms() - t0) / 1000.0;
    free(items);
    free(sent);
    if (rc) {
        free(lat);
        return xctl_die(EXIT_FAIL, "bench: %s", why);
    }
    qsort(lat, nreq, sizeof(*lat), cmp_u64);
    if (xctl_opt.json)
        printf("{\"transfers\":%" PRIu64 ",\"size\":%" PRIu64 ",\"depth\":%" PRIu64
               ",\"batch\":%" PRIu64 ",\"seconds\":%.3f,\"per_second\":%.0f,\"p50_us\":%" PRIu64
               ",\"p99_us\":%" PRIu64 ",\"failed_requests\":%" PRIu64 "}\n",
               count, size, depth, per, secs, secs > 0 ? (double)count / secs : 0, lat[nreq / 2],
               lat[nreq * 99 / 100], failed);
    else
        printf("%" PRIu64 " named transfers of %" PRIu64 " B (%s -> %s), depth %" PRIu64
               ", %" PRIu64 " per request: %.3f s, %.0f transfers/s, request p50 %" PRIu64
               " us p99 %" PRIu64 " us, %" PRIu64 " failed requests\n",
               count, size, src, dst, depth, per, secs, secs > 0 ? (double)count / secs : 0,
               lat[nreq / 2], lat[nreq * 99 / 100], failed);
    free(lat);
    return failed ? EXIT_FAIL : 0;
}
