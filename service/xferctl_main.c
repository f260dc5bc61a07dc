/* xferctl: command-line client of xferd (docs/service.md). Every error is
 * one line on stderr and a non-zero exit; every wait has a timeout. */
#include "xbench.h"
#include "config.h"
#include "ctl_client.h"
#include "ctl_print.h"
#include "frame.h"
#include "metrics_ctl.h"
#include "xfer_node.h"
#include "progress.h"
#include "xferctl.h"

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

static const char usage[] =
    "usage: xferctl [options] COMMAND [ARGS]\n"
    "Talks to an xferd (by default the local one over its unix socket).\n"
    "\n"
    "Commands (ADDR = NODE/REGION[+OFF] or NODE/REGION#BLOCK):\n"
    "  peers                       nodes in the registry\n"
    "  regions [NODE]              regions of NODE (default: the local node)\n"
    "  health                      is the xferd alive; its registry state\n"
    "  stats [NODE]                bytes, ops, errors per peer and transport\n"
    "      [--prometheus]          as the text of xferd's /metrics\n"
    "  register NAME SIZE          allocate a host region in xferd\n"
    "      [--access r|w|rw] [--layout DTYPE:BLOCK_BYTES:NUM_BLOCKS[:LAYERS[:TAG]]]\n"
    "      [--cuda-ipc HEX --gpu N [--cuda-offset OFF]]  GPU memory of a local process\n"
    "                              (its cudaIpcGetMemHandle, 128 hex digits)\n"
    "  deregister NAME             remove a region of the local xferd\n"
    "  write ADDR DATA|-           write DATA (or stdin) at ADDR\n"
    "  read ADDR LEN               print LEN bytes at ADDR to stdout\n"
    "  copy SRC DST LEN            named transfer (LEN in blocks for # addresses)\n"
    "      [--op read|write] [--async] [--notify TEXT]  TEXT reaches the remote node\n"
    "                              after the data (xferctl listen there)\n"
    "  copy NODE/POOL#B,.. NODE/POOL#B,..  KV pool blocks (lists of equal length,\n"
    "      [--layers A-B]          ranges 4-9 allowed), over all layers or A..B\n"
    "  pools [NODE]                KV pools of NODE: layout, geometry, member regions\n"
    "  pool-create NAME LAYOUT:DTYPE:BLOCK_BYTES:NUM_BLOCKS:LAYERS[:KV[:TAG]]\n"
    "                              host-memory pool in xferd (regions NAME.0, ...)\n"
    "  pool-delete NAME            remove it with its regions\n"
    "  notify NODE TEXT            send a notification to NODE\n"
    "  listen [--count N] [--timeout MS]  print notifications arriving here\n"
    "                              (--json: one object per line)\n"
    "  status BATCH_ID             state of an --async copy\n"
    "  batch FILE|-                lines 'SRC DST LEN' submitted as one batch [--op]\n"
    "      [--notify TEXT]  each remote node gets TEXT after its lines landed\n"
    "  put FILE ADDR               file -> region, through the local xferd\n"
    "  get ADDR LEN FILE           region -> file, through the local xferd\n"
    "  probe SRC DST               short latency and bandwidth test [--size N]\n"
    "  bench SRC DST               named transfers per second over the control path\n"
    "      [--count N] [--size N] [--depth N] [--batch N]\n"
    "  bench [--op write|read] [--size B] [--batch N] [--depth N] [--sockets N]\n"
    "      [--threads N] [--transport tcp|ipc] [--seconds S] [--verify] [--json]\n"
    "                              engine bench between two engines of this host\n"
    "                              (no xferd; GB/s, ops/s, p50/p99/p99.9)\n"
    "\n"
    "Options:\n"
    "  -s, --socket PATH      unix socket of xferd (XFER_CTRL_SOCKET)\n"
    "  -n, --node ID          local xferd by node id: /tmp/xferd-ID.sock (XFER_NODE)\n"
    "  -C, --connect H:PORT   xferd control port over TCP (XFER_CTRL_ADDR)\n"
    "      --secret S         cluster secret for TCP (XFER_SECRET)\n"
    "  -T, --timeout MS       per-request timeout, default 30000\n"
    "  -j, --json             JSON output for listings\n"
    "  -h, --help, -V, --version\n";

struct xferctl_opts xctl_opt = {.timeout_ms = 30000};
struct ctl_client *xctl_cli;

int xctl_die(int code, const char *fmt, ...)
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
    if (xctl_opt.connect) {
        char host[256];
        const char *colon = strrchr(xctl_opt.connect, ':');
        int port = colon ? atoi(colon + 1) : 0;
        if (!colon || port <= 0 || port > 65535 ||
            (size_t)(colon - xctl_opt.connect) >= sizeof(host))
            return xctl_die(EXIT_USAGE, "bad --connect '%s' (want HOST:PORT)", xctl_opt.connect);
        memcpy(host, xctl_opt.connect, (size_t)(colon - xctl_opt.connect));
        host[colon - xctl_opt.connect] = 0;
        xctl_cli = ctl_connect_tcp(host, (uint16_t)port, xctl_opt.secret, xctl_opt.timeout_ms, &err,
                                   why, sizeof(why));
    } else {
        char path[300];
        if (xctl_opt.socket)
            snprintf(path, sizeof(path), "%s", xctl_opt.socket);
        else if (xctl_opt.node)
            snprintf(path, sizeof(path), "/tmp/xferd-%s.sock", xctl_opt.node);
        else
            return xctl_die(EXIT_USAGE, "which xferd? give --socket, --node or --connect "
                                        "(or XFER_CTRL_SOCKET / XFER_NODE)");
        xctl_cli = ctl_connect_unix(path, xctl_opt.timeout_ms, &err, why, sizeof(why));
    }
    return xctl_cli ? 0 : xctl_die(EXIT_FAIL, "%s", why);
}

/* One request; on any failure prints the reason and returns non-zero. */
int xctl_call(Xctl__Request *req, int fd, Xctl__Response **r)
{
    char why[400];
    int rc = ctl_call(xctl_cli, req, fd, xctl_opt.timeout_ms, r, why, sizeof(why));
    if (rc)
        return xctl_die(EXIT_FAIL, "%s", why);
    if ((*r)->status) {
        xctl_die(EXIT_FAIL, "%s (%s)", (*r)->message && *(*r)->message ? (*r)->message : "failed",
                 xfer_strerror((*r)->status));
        xctl__response__free_unpacked(*r, NULL);
        *r = NULL;
        return EXIT_FAIL;
    }
    return 0;
}

int xctl_parse_len(const char *s, uint64_t *out)
{
    return xferd_parse_size(s, out) ? xctl_die(EXIT_USAGE, "bad length '%s'", s) : 0;
}

int xctl_check_addr(const char *s)
{
    struct xfer_node_addr n;
    char why[200];
    return xfer_node_addr_parse(s, &n, why, sizeof(why)) ? xctl_die(EXIT_USAGE, "%s", why) : 0;
}

static int cmd_peers(void)
{
    Xctl__ListPeers m = XCTL__LIST_PEERS__INIT;
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_PEERS;
    req.peers = &m;
    Xctl__Response *r;
    int rc = xctl_call(&req, -1, &r);
    if (rc)
        return rc;
    if (r->body_case == XCTL__RESPONSE__BODY_PEERS)
        print_peers(stdout, r->peers, xctl_opt.json);
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
    int rc = xctl_call(&req, -1, &r);
    if (rc)
        return rc;
    if (r->body_case == XCTL__RESPONSE__BODY_REGIONS)
        print_regions(stdout, r->regions, xctl_opt.json);
    xctl__response__free_unpacked(r, NULL);
    return 0;
}

int xctl_get_health(Xctl__Response **r)
{
    Xctl__Health m = XCTL__HEALTH__INIT;
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_HEALTH;
    req.health = &m;
    int rc = xctl_call(&req, -1, r);
    if (!rc && (*r)->body_case != XCTL__RESPONSE__BODY_HEALTH) {
        xctl__response__free_unpacked(*r, NULL);
        return xctl_die(EXIT_FAIL, "bad health answer");
    }
    return rc;
}

static int cmd_health(void)
{
    Xctl__Response *r;
    int rc = xctl_get_health(&r);
    if (rc)
        return rc;
    print_health(stdout, r->health, xctl_opt.json);
    xctl__response__free_unpacked(r, NULL);
    return 0;
}

/* The counters as the text of xferd's /metrics, by the same renderer. */
static int print_stats_prometheus(const Xctl__StatsInfo *si)
{
    struct xfer_metrics_snapshot snap;
    char *text = NULL;
    int rc = xfer_metrics_from_stats_msg(si, &snap);
    if (!rc)
        rc = xfer_metrics_render(&snap, &text, NULL);
    xfer_metrics_snapshot_clear(&snap);
    if (rc)
        return xctl_die(EXIT_FAIL, "stats: %s", xfer_strerror(rc));
    fputs(text, stdout);
    free(text);
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
    int rc = xctl_call(&req, -1, &r);
    if (rc)
        return rc;
    if (r->body_case == XCTL__RESPONSE__BODY_STATS && xctl_opt.prometheus)
        rc = print_stats_prometheus(r->stats);
    else if (r->body_case == XCTL__RESPONSE__BODY_STATS)
        print_stats(stdout, r->stats, xctl_opt.json);
    xctl__response__free_unpacked(r, NULL);
    return rc;
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
        return xctl_die(EXIT_USAGE,
                        "bad --layout '%s' (DTYPE:BLOCK_BYTES:NUM_BLOCKS[:LAYERS[:TAG]])", s);
    l->dtype = strdup(f[0]);
    l->tag = strdup(f[4] ? f[4] : "");
    l->block_bytes = bb;
    l->num_blocks = nb;
    l->layers = (uint32_t)layers;
    return 0;
}

/* Registers a region; fd >= 0 hands a memfd over (private staging). */
int xctl_register(const char *name, uint64_t len, const char *access, int fd, bool priv)
{
    Xctl__RegisterRegion m = XCTL__REGISTER_REGION__INIT;
    Xctl__Layout l = XCTL__LAYOUT__INIT;
    m.name = (char *)name;
    m.len = len;
    m.access = (char *)(access ? access : "rw");
    m.memfd = fd >= 0;
    m.private_ = priv;
    int rc = 0;
    uint8_t handle[64];
    if (xctl_opt.cuda_ipc) {
        const char *h = xctl_opt.cuda_ipc;
        size_t n = 0;
        while (n < sizeof(handle) && sscanf(h + 2 * n, "%2hhx", &handle[n]) == 1)
            n++;
        if (n != sizeof(handle) || strlen(h) != 2 * sizeof(handle))
            return xctl_die(EXIT_USAGE, "--cuda-ipc wants %zu hex digits", 2 * sizeof(handle));
        m.cuda_ipc.data = handle;
        m.cuda_ipc.len = sizeof(handle);
        m.gpu = xctl_opt.gpu;
        m.cuda_offset = xctl_opt.cuda_offset;
    }
    if (xctl_opt.layout && fd < 0) {
        if ((rc = parse_layout(xctl_opt.layout, &l)) != 0)
            return rc;
        m.layout = &l;
    }
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_REG;
    req.reg = &m;
    Xctl__Response *r;
    rc = xctl_call(&req, fd, &r);
    if (!rc)
        xctl__response__free_unpacked(r, NULL);
    if (m.layout) {
        free(l.dtype);
        free(l.tag);
    }
    return rc;
}

int xctl_deregister(const char *name)
{
    Xctl__DeregisterRegion m = XCTL__DEREGISTER_REGION__INIT;
    m.name = (char *)name;
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_DEREG;
    req.dereg = &m;
    Xctl__Response *r;
    int rc = xctl_call(&req, -1, &r);
    if (!rc)
        xctl__response__free_unpacked(r, NULL);
    return rc;
}

static int cmd_register(const char *name, const char *size)
{
    uint64_t len;
    int rc = xctl_parse_len(size, &len);
    return rc ? rc : xctl_register(name, len, xctl_opt.access, -1, false);
}

static int cmd_write(const char *addr, const char *data)
{
    int rc = xctl_check_addr(addr);
    if (rc)
        return rc;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (!strcmp(data, "-")) {
        buf = malloc(INLINE_MAX + 1);
        if (!buf)
            return xctl_die(EXIT_FAIL, "out of memory");
        size_t n;
        while (len <= INLINE_MAX && (n = fread(buf + len, 1, INLINE_MAX + 1 - len, stdin)) > 0)
            len += n;
        if (len > INLINE_MAX) {
            free(buf);
            return xctl_die(EXIT_USAGE, "stdin is over %d bytes: use put", INLINE_MAX);
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
    rc = xctl_call(&req, -1, &r);
    if (!rc)
        xctl__response__free_unpacked(r, NULL);
    free(buf);
    return rc;
}

static int cmd_read(const char *addr, const char *lens)
{
    uint64_t len;
    int rc = xctl_check_addr(addr) ? EXIT_USAGE : xctl_parse_len(lens, &len);
    if (rc)
        return rc;
    if (len > INLINE_MAX)
        return xctl_die(EXIT_USAGE, "read of more than %d bytes: use get", INLINE_MAX);
    Xctl__ReadData m = XCTL__READ_DATA__INIT;
    m.src = (char *)addr;
    m.len = len;
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_READ;
    req.read = &m;
    Xctl__Response *r;
    rc = xctl_call(&req, -1, &r);
    if (rc)
        return rc;
    if (r->body_case == XCTL__RESPONSE__BODY_DATA)
        fwrite(r->data->data.data, 1, r->data->data.len, stdout);
    xctl__response__free_unpacked(r, NULL);
    return fflush(stdout) ? xctl_die(EXIT_FAIL, "stdout: %s", strerror(errno)) : 0;
}

/* xferd gets a little less time than we wait, so its reason (which peer,
 * what timed out) arrives before our own timeout would fire. */
uint32_t xctl_server_deadline(void)
{
    return (uint32_t)(xctl_opt.timeout_ms > 1000 ? xctl_opt.timeout_ms - 250
                                                 : xctl_opt.timeout_ms * 3 / 4 + 1);
}

/* One named transfer, waited for; *out (if given) gets the response. */
int xctl_transfer(const char *src, const char *dst, uint64_t len, Xctl__Op op, uint32_t repeat,
                  bool async, const char *notify, Xctl__Response **out)
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
    if (notify) {
        b.notify.data = (uint8_t *)notify;
        b.notify.len = strlen(notify);
    }
    b.deadline_ms = xctl_server_deadline();
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_BATCH;
    req.batch = &b;
    Xctl__Response *r;
    int rc = xctl_call(&req, -1, &r);
    if (rc)
        return rc;
    if (r->body_case != XCTL__RESPONSE__BODY_BATCH || (!async && r->batch->n_items != 1)) {
        xctl__response__free_unpacked(r, NULL);
        return xctl_die(EXIT_FAIL, "bad answer to a transfer");
    }
    if (out)
        *out = r;
    else
        xctl__response__free_unpacked(r, NULL);
    return 0;
}

Xctl__Op xctl_parse_op(void)
{
    if (!xctl_opt.op)
        return XCTL__OP__OP_AUTO;
    return !strcmp(xctl_opt.op, "read")    ? XCTL__OP__OP_READ
           : !strcmp(xctl_opt.op, "write") ? XCTL__OP__OP_WRITE
                                           : (Xctl__Op)-1;
}

static int cmd_copy(const char *src, const char *dst, const char *lens)
{
    uint64_t len;
    int rc = xctl_check_addr(src) || xctl_check_addr(dst) ? EXIT_USAGE : xctl_parse_len(lens, &len);
    Xctl__Op op = xctl_parse_op();
    if (!rc && (int)op < 0)
        rc = xctl_die(EXIT_USAGE, "bad --op '%s' (read or write)", xctl_opt.op);
    Xctl__Response *r;
    if (rc || (rc = xctl_transfer(src, dst, len, op, 0, xctl_opt.async, xctl_opt.notify, &r)) != 0)
        return rc;

    if (xctl_opt.json || xctl_opt.async)
        print_batch(stdout, r->batch, xctl_opt.json);
    else
        printf("copied %" PRIu64 " bytes %s -> %s (by %s, %" PRIu64 " us)%s\n",
               r->batch->items[0]->bytes, src, dst, r->batch->items[0]->executor,
               r->batch->items[0]->elapsed_us, xctl_opt.notify ? ", notification delivered" : "");
    xctl__response__free_unpacked(r, NULL);
    return 0;
}

static int cmd_status(const char *ids)
{
    Xctl__QueryStatus m = XCTL__QUERY_STATUS__INIT;
    m.batch_id = strtoull(ids, NULL, 10);
    Xctl__Request req = XCTL__REQUEST__INIT;
    req.body_case = XCTL__REQUEST__BODY_QUERY;
    req.query = &m;
    Xctl__Response *r;
    int rc = xctl_call(&req, -1, &r);
    if (rc)
        return rc;
    print_batch(stdout, r->batch, xctl_opt.json);
    rc = 0;
    for (size_t i = 0; i < r->batch->n_items; i++)
        if (r->batch->items[i]->status)
            rc = EXIT_FAIL;
    xctl__response__free_unpacked(r, NULL);
    return rc;
}

static const struct option long_opts[] = {
    {"socket", required_argument, 0, 's'},
    {"node", required_argument, 0, 'n'},
    {"connect", required_argument, 0, 'C'},
    {"secret", required_argument, 0, 'S'},
    {"timeout", required_argument, 0, 'T'},
    {"json", no_argument, 0, 'j'},
    {"help", no_argument, 0, 'h'},
    {"version", no_argument, 0, 'V'},
    {"access", required_argument, 0, 'a'},
    {"layout", required_argument, 0, 'L'},
    {"op", required_argument, 0, 'o'},
    {"async", no_argument, 0, 'A'},
    {"size", required_argument, 0, 'z'},
    {"count", required_argument, 0, 'N'},
    {"depth", required_argument, 0, 'D'},
    {"batch", required_argument, 0, 'B'},
    {"prometheus", no_argument, 0, 'P'},
    {"cuda-ipc", required_argument, 0, 'I'},
    {"gpu", required_argument, 0, 'G'},
    {"cuda-offset", required_argument, 0, 'O'},
    {"notify", required_argument, 0, 'M'},
    {"layers", required_argument, 0, 'Y'},
    {0, 0, 0, 0},
};

static int parse_opts(int argc, char **argv, const char *optstring)
{
    int opt;
    while ((opt = getopt_long(argc, argv, optstring, long_opts, NULL)) != -1) {
        uint64_t *num = NULL;
        switch (opt) {
        case 's':
            xctl_opt.socket = optarg;
            break;
        case 'n':
            xctl_opt.node = optarg;
            xctl_opt.socket = NULL;
            break;
        case 'C':
            xctl_opt.connect = optarg;
            break;
        case 'S':
            xctl_opt.secret = optarg;
            break;
        case 'T':
            xctl_opt.timeout_ms = atoi(optarg);
            xctl_opt.timeout_set = true;
            break;
        case 'M':
            xctl_opt.notify = optarg;
            break;
        case 'Y':
            xctl_opt.layers = optarg;
            break;
        case 'j':
            xctl_opt.json = true;
            break;
        case 'P':
            xctl_opt.prometheus = true;
            break;
        case 'a':
            xctl_opt.access = optarg;
            break;
        case 'L':
            xctl_opt.layout = optarg;
            break;
        case 'o':
            xctl_opt.op = optarg;
            break;
        case 'A':
            xctl_opt.async = true;
            break;
        case 'z':
            num = &xctl_opt.size;
            break;
        case 'N':
            num = &xctl_opt.count;
            break;
        case 'D':
            num = &xctl_opt.depth;
            break;
        case 'B':
            num = &xctl_opt.batch;
            break;
        case 'I':
            xctl_opt.cuda_ipc = optarg;
            break;
        case 'G':
            xctl_opt.gpu = atoi(optarg);
            break;
        case 'O':
            num = &xctl_opt.cuda_offset;
            break;
        case 'h':
            fputs(usage, stdout);
            return -1;
        case 'V':
            printf("xferctl %s (protocol %u)\n", XFER_VERSION_STRING, XFER_PROTO_VERSION);
            return -1;
        default:
            return xctl_die(EXIT_USAGE, "try --help");
        }
        if (num && (xferd_parse_size(optarg, num) || *num == 0))
            return xctl_die(EXIT_USAGE, "bad number '%s'", optarg);
    }
    if (xctl_opt.timeout_ms <= 0)
        return xctl_die(EXIT_USAGE, "bad --timeout");
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
    struct {
        const char *name;
        int min, max;
    } cmds[] = {
        {"peers", 0, 0},    {"regions", 0, 1},    {"health", 0, 0},      {"stats", 0, 1},
        {"register", 2, 2}, {"deregister", 1, 1}, {"write", 2, 2},       {"read", 2, 2},
        {"copy", 2, 3},     {"status", 1, 1},     {"put", 2, 2},         {"get", 3, 3},
        {"probe", 2, 2},    {"bench", 2, 2},      {"batch", 1, 1},       {"notify", 2, 2},
        {"listen", 0, 0},   {"pools", 0, 1},      {"pool-create", 2, 2}, {"pool-delete", 1, 1},
    };
    size_t k;
    for (k = 0; k < sizeof(cmds) / sizeof(cmds[0]); k++)
        if (!strcmp(cmd, cmds[k].name))
            break;
    if (k == sizeof(cmds) / sizeof(cmds[0]))
        return xctl_die(EXIT_USAGE, "unknown command '%s' (try --help)", cmd);
    if (nw < cmds[k].min || nw > cmds[k].max)
        return xctl_die(EXIT_USAGE, "%s: wrong number of arguments (try --help)", cmd);
    if (xctl_opt.notify && (k != 8 || nw != 3) && k != 14)
        return xctl_die(EXIT_USAGE, "--notify goes with copy SRC DST LEN or batch FILE");
    if ((rc = connect_xferd()) != 0)
        return rc;
    const char *a0 = nw > 0 ? words[0] : NULL, *a1 = nw > 1 ? words[1] : NULL;
    const char *a2 = nw > 2 ? words[2] : NULL;
    switch (k) {
    case 0:
        return cmd_peers();
    case 1:
        return cmd_regions(a0);
    case 2:
        return cmd_health();
    case 3:
        return cmd_stats(a0);
    case 4:
        return cmd_register(a0, a1);
    case 5:
        return xctl_deregister(a0);
    case 6:
        return cmd_write(a0, a1);
    case 7:
        return cmd_read(a0, a1);
    case 8: /* two addresses with block lists: KV pool blocks */
        return a2 ? cmd_copy(a0, a1, a2) : xctl_cmd_pool_copy(a0, a1);
    case 9:
        return cmd_status(a0);
    case 10:
        return xctl_cmd_put(a0, a1);
    case 11:
        return xctl_cmd_get(a0, a1, a2);
    case 12:
        return xctl_cmd_probe(a0, a1);
    case 13:
        return xctl_cmd_bench(a0, a1);
    case 14:
        return xctl_cmd_batch(a0);
    case 15:
        return xctl_cmd_notify(a0, a1);
    case 16:
        return xctl_cmd_listen();
    case 17:
        return xctl_cmd_pools(a0);
    case 18:
        return xctl_cmd_pool_create(a0, a1);
    default:
        return xctl_cmd_pool_delete(a0);
    }
}

int main(int argc, char **argv)
{
    xctl_opt.socket = getenv("XFER_CTRL_SOCKET");
    xctl_opt.node = getenv("XFER_NODE");
    xctl_opt.connect = getenv("XFER_CTRL_ADDR");
    xctl_opt.secret = getenv("XFER_SECRET");
    int rc = parse_opts(argc, argv, "+s:n:C:T:jhV");
    if (rc)
        return rc < 0 ? 0 : rc;
    if (optind >= argc)
        return xctl_die(EXIT_USAGE, "no command (try --help)");
    if (!strcmp(argv[optind], "bench")) { /* engine bench unless given NODE/REGION addresses */
        bool named = false;
        for (int i = optind + 1; i < argc; i++)
            named |= argv[i][0] != '-' && strchr(argv[i], '/') != NULL;
        if (!named)
            return xbench_main(argc - optind, argv + optind, "xferctl bench");
    }
    /* Re-parse from the command on, so "xferctl copy --op read A B N" works. */
    rc = run(argc - optind, argv + optind);
    ctl_close(xctl_cli);
    return rc < 0 ? 0 : rc;
}
