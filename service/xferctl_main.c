/* xferctl: command-line client of xferd (docs/service.md). Every error is
 * one line on stderr and a non-zero exit; every wait has a timeout. */
#include "config.h"
#include "ctl_client.h"
#include "ctl_print.h"
#include "frame.h"
#include "naddr.h"
#include "progress.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXIT_FAIL 1
#define EXIT_USAGE 2
#define INLINE_MAX (XFER_FRAME_MAX - 4096)
#define STAGE_MAX (8u << 20)

static const char usage[] =
    "usage: xferctl [options] COMMAND [ARGS]\n"
    "Talks to an xferd (by default the local one over its unix socket).\n"
    "\n"
    "Commands (ADDR = NODE/REGION[+OFF] or NODE/REGION#BLOCK):\n"
    "  peers                       nodes in the registry\n"
    "  regions [NODE]              regions of NODE (default: the local node)\n"
    "  health                      is the xferd alive; its registry state\n"
    "  stats [NODE]                bytes, ops, errors per peer and transport\n"
    "  register NAME SIZE          allocate a host region in xferd\n"
    "      [--access r|w|rw] [--layout DTYPE:BLOCK_BYTES:NUM_BLOCKS[:LAYERS[:TAG]]]\n"
    "  deregister NAME             remove a region of the local xferd\n"
    "  write ADDR DATA|-           write DATA (or stdin) at ADDR\n"
    "  read ADDR LEN               print LEN bytes at ADDR to stdout\n"
    "  copy SRC DST LEN            named transfer (LEN in blocks for # addresses)\n"
    "      [--op read|write] [--async]\n"
    "  status BATCH_ID             state of an --async copy\n"
    "  batch FILE|-                lines 'SRC DST LEN' submitted as one batch [--op]\n"
    "  put FILE ADDR               file -> region, through the local xferd\n"
    "  get ADDR LEN FILE           region -> file, through the local xferd\n"
    "  probe SRC DST               short latency and bandwidth test [--size N]\n"
    "  bench SRC DST               named transfers per second over the control path\n"
    "      [--count N] [--size N] [--depth N] [--batch N]\n"
    "\n"
    "Options:\n"
    "  -s, --socket PATH      unix socket of xferd (XFER_CTRL_SOCKET)\n"
    "  -n, --node ID          local xferd by node id: /tmp/xferd-ID.sock (XFER_NODE)\n"
    "  -C, --connect H:PORT   xferd control port over TCP (XFER_CTRL_ADDR)\n"
    "      --secret S         cluster secret for TCP (XFER_SECRET)\n"
    "  -T, --timeout MS       per-request timeout, default 30000\n"
    "  -j, --json             JSON output for listings\n"
    "  -h, --help, -V, --version\n";

struct opts {
    const char *socket, *node, *connect, *secret, *access, *layout, *op;
    int timeout_ms;
    bool json, async;
    uint64_t size, count, depth, batch;
};
static struct opts o = {.timeout_ms = 30000};
static struct ctl_client *cli;

static int die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int die(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("xferctl: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

static int connect_xferd(void)
{
    char why[400];
    int err = 0;
    if (o.connect) {
        char host[256];
        const char *colon = strrchr(o.connect, ':');
        int port = colon ? atoi(colon + 1) : 0;
        if (!colon || port <= 0 || port > 65535 || (size_t)(colon - o.connect) >= sizeof(host))
            return die(EXIT_USAGE, "bad --connect '%s' (want HOST:PORT)", o.connect);
        memcpy(host, o.connect, (size_t)(colon - o.connect));
        host[colon - o.connect] = 0;
        cli = ctl_connect_tcp(host, (uint16_t)port, o.secret, o.timeout_ms, &err, why,
                              sizeof(why));
    } else {
        char path[300];
        if (o.socket)
            snprintf(path, sizeof(path), "%s", o.socket);
        else if (o.node)
            snprintf(path, sizeof(path), "/tmp/xferd-%s.sock", o.node);
        else
            return die(EXIT_USAGE, "which xferd? give --socket, --node or --connect "
                                   "(or XFER_CTRL_SOCKET / XFER_NODE)");
        cli = ctl_connect_unix(path, o.timeout_ms, &err, why, sizeof(why));
    }
    return cli ? 0 : die(EXIT_FAIL, "%s", why);
}

/* One request; on any failure prints the reason and returns non-zero. */
static int call(Xctl__Request *req, int fd, Xctl__Response **r)
{
    char why[400];
    int rc = ctl_call(cli, req, fd, o.timeout_ms, r, why, sizeof(why));
    if (rc)
        return die(EXIT_FAIL, "%s", why);
    if ((*r)->status) {
        die(EXIT_FAIL, "%s (%s)", (*r)->message && *(*r)->message ? (*r)->message : "failed",
            xfer_strerror((*r)->status));
        xctl__response__free_unpacked(*r, NULL);
        *r = NULL;
        return EXIT_FAIL;
    }
    return 0;
}

static int parse_len(const char *s, uint64_t *out)
{
    return xferd_parse_size(s, out) ? die(EXIT_USAGE, "bad length '%s'", s) : 0;
}

static int check_addr(const char *s)
{
    struct naddr n;
    char why[200];
    return naddr_parse(s, &n, why, sizeof(why)) ? die(EXIT_USAGE, "%s", why) : 0;
}

static int cmd_peers(void)
{
    Xctl__ListPeers m = XCTL__LIST_PEERS__INIT;
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_PEERS;
    req.peers = &m;
    Xctl__Response *r;
    int rc = call(&req, -1, &r);
    if (rc)
        return rc;
    if (r->body_case == XCTL__RESPONSE__BODY_PEERS)
        print_peers(stdout, r->peers, o.json);
    xctl__response__free_unpacked(r, NULL);
    return 0;
}

static int cmd_regions(const char *node)
{
    Xctl__ListRegions m = XCTL__LIST_REGIONS__INIT;
    m.node = (char *)(node ? node : "");
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_REGIONS;
    req.regions = &m;
    Xctl__Response *r;
    int rc = call(&req, -1, &r);
    if (rc)
        return rc;
    if (r->body_case == XCTL__RESPONSE__BODY_REGIONS)
        print_regions(stdout, r->regions, o.json);
    xctl__response__free_unpacked(r, NULL);
    return 0;
}

static int get_health(Xctl__Response **r)
{
    Xctl__Health m = XCTL__HEALTH__INIT;
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_HEALTH;
    req.health = &m;
    int rc = call(&req, -1, r);
    if (!rc && (*r)->body_case != XCTL__RESPONSE__BODY_HEALTH) {
        xctl__response__free_unpacked(*r, NULL);
        return die(EXIT_FAIL, "bad health answer");
    }
    return rc;
}

static int cmd_health(void)
{
    Xctl__Response *r;
    int rc = get_health(&r);
    if (rc)
        return rc;
    print_health(stdout, r->health, o.json);
    xctl__response__free_unpacked(r, NULL);
    return 0;
}

static int cmd_stats(const char *node)
{
    Xctl__GetStats m = XCTL__GET_STATS__INIT;
    m.node = (char *)(node ? node : "");
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_STATS;
    req.stats = &m;
    Xctl__Response *r;
    int rc = call(&req, -1, &r);
    if (rc)
        return rc;
    if (r->body_case == XCTL__RESPONSE__BODY_STATS)
        print_stats(stdout, r->stats, o.json);
    xctl__response__free_unpacked(r, NULL);
    return 0;
}

static int parse_layout(const char *s, Xctl__Layout *l)
{
    char buf[256], *save = NULL;
    snprintf(buf, sizeof(buf), "%s", s);
    char *f[5] = {0};
    for (int i = 0; i < 5; i++)
        f[i] = strtok_r(i ? NULL : buf, ":", &save);
    uint64_t bb, nb, layers = 0;
    if (!f[0] || !f[1] || !f[2] || xferd_parse_size(f[1], &bb) || xferd_parse_size(f[2], &nb) ||
        (f[3] && xferd_parse_size(f[3], &layers)))
        return die(EXIT_USAGE, "bad --layout '%s' (DTYPE:BLOCK_BYTES:NUM_BLOCKS[:LAYERS[:TAG]])", s);
    l->dtype = strdup(f[0]);
    l->tag = strdup(f[4] ? f[4] : "");
    l->block_bytes = bb;
    l->num_blocks = nb;
    l->layers = (uint32_t)layers;
    return 0;
}

/* Registers a region; fd >= 0 hands a memfd over (private staging). */
static int do_register(const char *name, uint64_t len, const char *access, int fd, bool priv)
{
    Xctl__RegisterRegion m = XCTL__REGISTER_REGION__INIT;
    Xctl__Layout l = XCTL__LAYOUT__INIT;
    m.name = (char *)name;
    m.len = len;
    m.access = (char *)(access ? access : "rw");
    m.memfd = fd >= 0;
    m.private_ = priv;
    int rc = 0;
    if (o.layout && fd < 0) {
        if ((rc = parse_layout(o.layout, &l)) != 0)
            return rc;
        m.layout = &l;
    }
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_REG;
    req.reg = &m;
    Xctl__Response *r;
    rc = call(&req, fd, &r);
    if (!rc)
        xctl__response__free_unpacked(r, NULL);
    if (m.layout) {
        free(l.dtype);
        free(l.tag);
    }
    return rc;
}

static int do_deregister(const char *name)
{
    Xctl__DeregisterRegion m = XCTL__DEREGISTER_REGION__INIT;
    m.name = (char *)name;
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_DEREG;
    req.dereg = &m;
    Xctl__Response *r;
    int rc = call(&req, -1, &r);
    if (!rc)
        xctl__response__free_unpacked(r, NULL);
    return rc;
}

static int cmd_register(const char *name, const char *size)
{
    uint64_t len;
    int rc = parse_len(size, &len);
    return rc ? rc : do_register(name, len, o.access, -1, false);
}

static int cmd_write(const char *addr, const char *data)
{
    int rc = check_addr(addr);
    if (rc)
        return rc;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (!strcmp(data, "-")) {
        buf = malloc(INLINE_MAX + 1);
        if (!buf)
            return die(EXIT_FAIL, "out of memory");
        size_t n;
        while (len <= INLINE_MAX && (n = fread(buf + len, 1, INLINE_MAX + 1 - len, stdin)) > 0)
            len += n;
        if (len > INLINE_MAX) {
            free(buf);
            return die(EXIT_USAGE, "stdin is over %d bytes: use put", INLINE_MAX);
        }
    }
    Xctl__WriteData m = XCTL__WRITE_DATA__INIT;
    m.dst = (char *)addr;
    m.data.data = buf ? buf : (uint8_t *)data;
    m.data.len = buf ? len : strlen(data);
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_WRITE;
    req.write = &m;
    Xctl__Response *r;
    rc = call(&req, -1, &r);
    if (!rc)
        xctl__response__free_unpacked(r, NULL);
    free(buf);
    return rc;
}

static int cmd_read(const char *addr, const char *lens)
{
    uint64_t len;
    int rc = check_addr(addr) ? EXIT_USAGE : parse_len(lens, &len);
    if (rc)
        return rc;
    if (len > INLINE_MAX)
        return die(EXIT_USAGE, "read of more than %d bytes: use get", INLINE_MAX);
    Xctl__ReadData m = XCTL__READ_DATA__INIT;
    m.src = (char *)addr;
    m.len = len;
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_READ;
    req.read = &m;
    Xctl__Response *r;
    rc = call(&req, -1, &r);
    if (rc)
        return rc;
    if (r->body_case == XCTL__RESPONSE__BODY_DATA)
        fwrite(r->data->data.data, 1, r->data->data.len, stdout);
    xctl__response__free_unpacked(r, NULL);
    return fflush(stdout) ? die(EXIT_FAIL, "stdout: %s", strerror(errno)) : 0;
}

/* xferd gets a little less time than we wait, so its reason (which peer,
 * what timed out) arrives before our own timeout would fire. */
static uint32_t server_deadline(void)
{
    return (uint32_t)(o.timeout_ms > 1000 ? o.timeout_ms - 250 : o.timeout_ms * 3 / 4 + 1);
}

/* One named transfer, waited for; *res gets its result when asked. */
static int transfer(const char *src, const char *dst, uint64_t len, Xctl__Op op, uint32_t repeat,
                    bool async, Xctl__Response **out)
{
    Xctl__Transfer t = XCTL__TRANSFER__INIT;
    t.op = op;
    t.src = (char *)src;
    t.dst = (char *)dst;
    t.len = len;
    t.repeat = repeat;
    Xctl__Transfer *items[1] = {&t};
    Xctl__SubmitBatch b = XCTL__SUBMIT_BATCH__INIT;
    b.n_items = 1;
    b.items = items;
    b.async = async;
    b.deadline_ms = server_deadline();
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_BATCH;
    req.batch = &b;
    Xctl__Response *r;
    int rc = call(&req, -1, &r);
    if (rc)
        return rc;
    if (r->body_case != XCTL__RESPONSE__BODY_BATCH || (!async && r->batch->n_items != 1)) {
        xctl__response__free_unpacked(r, NULL);
        return die(EXIT_FAIL, "bad answer to a transfer");
    }
    if (out)
        *out = r;
    else
        xctl__response__free_unpacked(r, NULL);
    return 0;
}

static Xctl__Op parse_op(void)
{
    if (!o.op)
        return XCTL__OP__OP_AUTO;
    return !strcmp(o.op, "read") ? XCTL__OP__OP_READ
           : !strcmp(o.op, "write") ? XCTL__OP__OP_WRITE
                                     : (Xctl__Op)-1;
}

static int cmd_copy(const char *src, const char *dst, const char *lens)
{
    uint64_t len;
    int rc = check_addr(src) || check_addr(dst) ? EXIT_USAGE : parse_len(lens, &len);
    Xctl__Op op = parse_op();
    if (!rc && (int)op < 0)
        rc = die(EXIT_USAGE, "bad --op '%s' (read or write)", o.op);
    Xctl__Response *r;
    if (rc || (rc = transfer(src, dst, len, op, 0, o.async, &r)) != 0)
        return rc;
    if (o.json || o.async)
        print_batch(stdout, r->batch, o.json);
    else
        printf("copied %" PRIu64 " bytes %s -> %s (by %s, %" PRIu64 " us)\n",
               r->batch->items[0]->bytes, src, dst, r->batch->items[0]->executor,
               r->batch->items[0]->elapsed_us);
    xctl__response__free_unpacked(r, NULL);
    return 0;
}

/* Lines "SRC DST LEN" (from FILE or stdin) submitted as one batch. */
static int cmd_batch(const char *file)
{
    FILE *f = strcmp(file, "-") ? fopen(file, "r") : stdin;
    if (!f)
        return die(EXIT_FAIL, "%s: %s", file, strerror(errno));
    Xctl__Transfer *items = calloc(4096, sizeof(*items));
    Xctl__Transfer **ptrs = calloc(4096, sizeof(*ptrs));
    char line[512];
    size_t n = 0;
    int rc = items && ptrs ? 0 : die(EXIT_FAIL, "out of memory");
    Xctl__Op op = parse_op();
    while (!rc && fgets(line, sizeof(line), f)) {
        char src[200], dst[200], lens[64];
        if (line[0] == '#' || strspn(line, " \t\n") == strlen(line))
            continue;
        if (n == 4096 || sscanf(line, "%199s %199s %63s", src, dst, lens) != 3) {
            rc = die(EXIT_USAGE, "batch line %zu: want 'SRC DST LEN' (at most 4096 lines)", n + 1);
            break;
        }
        xctl__transfer__init(&items[n]);
        items[n].op = op;
        items[n].src = strdup(src);
        items[n].dst = strdup(dst);
        rc = parse_len(lens, &items[n].len);
        ptrs[n] = &items[n];
        n++;
    }
    if (f != stdin)
        fclose(f);
    if (!rc && n == 0)
        rc = die(EXIT_USAGE, "empty batch");
    if (!rc) {
        Xctl__SubmitBatch b = XCTL__SUBMIT_BATCH__INIT;
        b.n_items = n;
        b.items = ptrs;
        b.deadline_ms = server_deadline();
        Xctl__Request req = XCTL__REQUEST__INIT;
        req.body_case = XCTL__REQUEST__BODY_BATCH;
        req.batch = &b;
        Xctl__Response *r = NULL;
        char why[400];
        rc = ctl_call(cli, &req, -1, o.timeout_ms, &r, why, sizeof(why));
        if (rc)
            rc = die(EXIT_FAIL, "%s", why);
        else if (r->body_case == XCTL__RESPONSE__BODY_BATCH)
            print_batch(stdout, r->batch, o.json);
        if (!rc && r->status)
            rc = die(EXIT_FAIL, "%s (%s)", r->message, xfer_strerror(r->status));
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

static int cmd_status(const char *ids)
{
    Xctl__QueryStatus m = XCTL__QUERY_STATUS__INIT;
    m.batch_id = strtoull(ids, NULL, 10);
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_QUERY;
    req.query = &m;
    Xctl__Response *r;
    int rc = call(&req, -1, &r);
    if (rc)
        return rc;
    print_batch(stdout, r->batch, o.json);
    rc = 0;
    for (size_t i = 0; i < r->batch->n_items; i++)
        if (r->batch->items[i]->status)
            rc = EXIT_FAIL;
    xctl__response__free_unpacked(r, NULL);
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
    Xctl__Response *r;
    int rc = get_health(&r);
    if (rc)
        return rc;
    s->len = want < 4096 ? 4096 : want > STAGE_MAX ? STAGE_MAX : want;
    snprintf(s->name, sizeof(s->name), "_%s.%d", what, (int)getpid());
    snprintf(s->addr, sizeof(s->addr), "%s/%s", r->health->node, s->name);
    xctl__response__free_unpacked(r, NULL);
    s->fd = memfd_create("xferctl-stage", MFD_CLOEXEC);
    if (s->fd < 0 || ftruncate(s->fd, (off_t)s->len))
        return die(EXIT_FAIL, "staging memfd: %s", strerror(errno));
    s->map = mmap(NULL, s->len, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    if (s->map == MAP_FAILED) {
        s->map = NULL;
        return die(EXIT_FAIL, "staging mmap: %s", strerror(errno));
    }
    return do_register(s->name, s->len, "rw", s->fd, true);
}

static void stage_close(struct stage *s, bool registered)
{
    if (registered)
        do_deregister(s->name);
    if (s->map)
        munmap(s->map, s->len);
    if (s->fd >= 0)
        close(s->fd);
}

static int byte_addr(const char *addr, struct naddr *n)
{
    char why[200];
    if (naddr_parse(addr, n, why, sizeof(why)))
        return die(EXIT_USAGE, "%s", why);
    if (n->is_block)
        return die(EXIT_USAGE, "put/get take a byte address (NODE/REGION+OFF)");
    return 0;
}

static int cmd_put(const char *file, const char *addr)
{
    struct naddr n;
    int rc = byte_addr(addr, &n);
    if (rc)
        return rc;
    int ffd = open(file, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (ffd < 0 || fstat(ffd, &st)) {
        rc = die(EXIT_FAIL, "%s: %s", file, strerror(errno));
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
            rc = die(EXIT_FAIL, "%s: %s", file, got < 0 ? strerror(errno) : "shrank while reading");
            break;
        }
        char dst[XFER_NAME_MAX * 2 + 32];
        snprintf(dst, sizeof(dst), "%s/%s+%" PRIu64, n.node, n.region, n.off + off);
        rc = transfer(s.addr, dst, (uint64_t)got, XCTL__OP__OP_AUTO, 0, false, NULL);
        off += (uint64_t)got;
        progress_add(&p, (uint64_t)got);
    }
    progress_end(&p);
    stage_close(&s, reg);
    close(ffd);
    return rc;
}

static int cmd_get(const char *addr, const char *lens, const char *file)
{
    struct naddr n;
    uint64_t total;
    int rc = byte_addr(addr, &n) ? EXIT_USAGE : parse_len(lens, &total);
    if (rc)
        return rc;
    int ffd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (ffd < 0)
        return die(EXIT_FAIL, "%s: %s", file, strerror(errno));
    struct stage s = {.fd = -1};
    rc = stage_open(&s, "get", total);
    bool reg = rc == 0;
    struct progress p;
    progress_start(&p, "get", total, 4u << 20);
    for (uint64_t off = 0; !rc && off < total;) {
        uint64_t len = total - off < s.len ? total - off : s.len;
        char src[XFER_NAME_MAX * 2 + 32];
        snprintf(src, sizeof(src), "%s/%s+%" PRIu64, n.node, n.region, n.off + off);
        rc = transfer(src, s.addr, len, XCTL__OP__OP_AUTO, 0, false, NULL);
        if (!rc && pwrite(ffd, s.map, len, (off_t)off) != (ssize_t)len)
            rc = die(EXIT_FAIL, "%s: %s", file, strerror(errno));
        off += len;
        progress_add(&p, len);
    }
    progress_end(&p);
    stage_close(&s, reg);
    if (close(ffd) && !rc)
        rc = die(EXIT_FAIL, "%s: %s", file, strerror(errno));
    if (rc)
        unlink(file);
    return rc;
}

static int cmd_probe(const char *src, const char *dst)
{
    int rc = check_addr(src) || check_addr(dst) ? EXIT_USAGE : 0;
    uint64_t size = o.size ? o.size : 1u << 20, small = size < 4096 ? size : 4096;
    uint32_t n = o.count ? (uint32_t)o.count : 20;
    Xctl__Response *lat = NULL, *bw = NULL;
    if (rc || (rc = transfer(src, dst, small, parse_op(), n * 5, false, &lat)) ||
        (rc = transfer(src, dst, size, parse_op(), n, false, &bw))) {
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
static int cmd_bench(const char *src, const char *dst)
{
    uint64_t count = o.count ? o.count : 10000, size = o.size ? o.size : 64;
    uint64_t depth = o.depth ? o.depth : 16, per = o.batch ? o.batch : 1;
    int rc = check_addr(src) || check_addr(dst) ? EXIT_USAGE : 0;
    if (rc)
        return rc;
    if (per > 4096)
        return die(EXIT_USAGE, "--batch is at most 4096");
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
        return die(EXIT_FAIL, "out of memory");
    }
    for (uint64_t i = 0; i < per; i++)
        items[i] = &t;
    Xctl__SubmitBatch b = XCTL__SUBMIT_BATCH__INIT;
    b.items = items;
    b.deadline_ms = server_deadline();
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_BATCH;
    req.batch = &b;
    char why[400];
    uint64_t issued = 0, done = 0, failed = 0, first_id = 0;
    int64_t t0 = xfer_now_ms();
    while (!rc && done < nreq) {
        while (issued < nreq && issued - done < depth) {
            b.n_items = issued == nreq - 1 && count % per ? count % per : per;
            if ((rc = ctl_send(cli, &req, o.timeout_ms, why, sizeof(why))) != 0)
                break;
            if (issued == 0)
                first_id = req.id;
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            sent[issued++] = ts.tv_sec * 1000000000LL + ts.tv_nsec;
        }
        Xctl__Response *r = NULL;
        if (rc || (rc = ctl_recv(cli, o.timeout_ms, &r, why, sizeof(why))) != 0)
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
        return die(EXIT_FAIL, "bench: %s", why);
    }
    qsort(lat, nreq, sizeof(*lat), cmp_u64);
    if (o.json)
        printf("{\"transfers\":%" PRIu64 ",\"size\":%" PRIu64 ",\"depth\":%" PRIu64
               ",\"batch\":%" PRIu64 ",\"seconds\":%.3f,\"per_second\":%.0f,\"p50_us\":%" PRIu64
               ",\"p99_us\":%" PRIu64 ",\"failed_requests\":%" PRIu64 "}\n",
               count, size, depth, per, secs, secs > 0 ? (double)count / secs : 0,
               lat[nreq / 2], lat[nreq * 99 / 100], failed);
    else
        printf("%" PRIu64 " named transfers of %" PRIu64 " B (%s -> %s), depth %" PRIu64
               ", %" PRIu64 " per request: %.3f s, %.0f transfers/s, request p50 %" PRIu64
               " us p99 %" PRIu64 " us, %" PRIu64 " failed requests\n",
               count, size, src, dst, depth, per, secs, secs > 0 ? (double)count / secs : 0,
               lat[nreq / 2], lat[nreq * 99 / 100], failed);
    free(lat);
    return failed ? EXIT_FAIL : 0;
}

static const struct option long_opts[] = {
    {"socket", required_argument, 0, 's'},  {"node", required_argument, 0, 'n'},
    {"connect", required_argument, 0, 'C'}, {"secret", required_argument, 0, 'S'},
    {"timeout", required_argument, 0, 'T'}, {"json", no_argument, 0, 'j'},
    {"help", no_argument, 0, 'h'},          {"version", no_argument, 0, 'V'},
    {"access", required_argument, 0, 'a'},  {"layout", required_argument, 0, 'L'},
    {"op", required_argument, 0, 'o'},      {"async", no_argument, 0, 'A'},
    {"size", required_argument, 0, 'z'},    {"count", required_argument, 0, 'N'},
    {"depth", required_argument, 0, 'D'},   {"batch", required_argument, 0, 'B'},
    {0, 0, 0, 0},
};

static int parse_opts(int argc, char **argv, const char *optstring)
{
    int opt;
    while ((opt = getopt_long(argc, argv, optstring, long_opts, NULL)) != -1) {
        uint64_t *num = NULL;
        switch (opt) {
        case 's': o.socket = optarg; break;
        case 'n': o.node = optarg; o.socket = NULL; break;
        case 'C': o.connect = optarg; break;
        case 'S': o.secret = optarg; break;
        case 'T': o.timeout_ms = atoi(optarg); break;
        case 'j': o.json = true; break;
        case 'a': o.access = optarg; break;
        case 'L': o.layout = optarg; break;
        case 'o': o.op = optarg; break;
        case 'A': o.async = true; break;
        case 'z': num = &o.size; break;
        case 'N': num = &o.count; break;
        case 'D': num = &o.depth; break;
        case 'B': num = &o.batch; break;
        case 'h': fputs(usage, stdout); return -1;
        case 'V': printf("xferctl %s (protocol %u)\n", XFER_VERSION_STRING, XFER_PROTO_VERSION);
                  return -1;
        default: return die(EXIT_USAGE, "try --help");
        }
        if (num && (xferd_parse_size(optarg, num) || *num == 0))
            return die(EXIT_USAGE, "bad number '%s'", optarg);
    }
    if (o.timeout_ms <= 0)
        return die(EXIT_USAGE, "bad --timeout");
    return 0;
}

/* Options may also follow the command: collect them, then the words. */
static int run(int argc, char **argv)
{
    const char *cmd = argv[0];
    char *words[8];
    int nw = 0;
    optind = 0; /* glibc: full re-initialisation, then permute */
    int rc = parse_opts(argc, argv, "s:n:C:T:jhV");
    if (rc)
        return rc;
    for (int i = optind; i < argc && nw < 8; i++)
        words[nw++] = argv[i];
    struct { const char *name; int min, max; } cmds[] = {
        {"peers", 0, 0}, {"regions", 0, 1}, {"health", 0, 0}, {"stats", 0, 1},
        {"register", 2, 2}, {"deregister", 1, 1}, {"write", 2, 2}, {"read", 2, 2},
        {"copy", 3, 3}, {"status", 1, 1}, {"put", 2, 2}, {"get", 3, 3},
        {"probe", 2, 2}, {"bench", 2, 2}, {"batch", 1, 1},
    };
    size_t k;
    for (k = 0; k < sizeof(cmds) / sizeof(cmds[0]); k++)
        if (!strcmp(cmd, cmds[k].name))
            break;
    if (k == sizeof(cmds) / sizeof(cmds[0]))
        return die(EXIT_USAGE, "unknown command '%s' (try --help)", cmd);
    if (nw < cmds[k].min || nw > cmds[k].max)
        return die(EXIT_USAGE, "%s: wrong number of arguments (try --help)", cmd);
    if ((rc = connect_xferd()) != 0)
        return rc;
    const char *a0 = nw > 0 ? words[0] : NULL, *a1 = nw > 1 ? words[1] : NULL;
    const char *a2 = nw > 2 ? words[2] : NULL;
    switch (k) {
    case 0: return cmd_peers();
    case 1: return cmd_regions(a0);
    case 2: return cmd_health();
    case 3: return cmd_stats(a0);
    case 4: return cmd_register(a0, a1);
    case 5: return do_deregister(a0);
    case 6: return cmd_write(a0, a1);
    case 7: return cmd_read(a0, a1);
    case 8: return cmd_copy(a0, a1, a2);
    case 9: return cmd_status(a0);
    case 10: return cmd_put(a0, a1);
    case 11: return cmd_get(a0, a1, a2);
    case 12: return cmd_probe(a0, a1);
    case 13: return cmd_bench(a0, a1);
    default: return cmd_batch(a0);
    }
}

int main(int argc, char **argv)
{
    o.socket = getenv("XFER_CTRL_SOCKET");
    o.node = getenv("XFER_NODE");
    o.connect = getenv("XFER_CTRL_ADDR");
    o.secret = getenv("XFER_SECRET");
    int rc = parse_opts(argc, argv, "+s:n:C:T:jhV");
    if (rc)
        return rc < 0 ? 0 : rc;
    if (optind >= argc)
        return die(EXIT_USAGE, "no command (try --help)");
    /* Re-parse from the command on, so "xferctl copy --op read A B N" works. */
    rc = run(argc - optind, argv + optind);
    ctl_close(cli);
    return rc < 0 ? 0 : rc;
}
