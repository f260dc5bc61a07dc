/* ipc_node: entry point, the child-owner plumbing and shared helpers. */
#include "ipc_test.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ANSWER_TIMEOUT_MS 60000

uint64_t ipc_sum_host(const void *p, size_t len)
{
    const uint8_t *b = p;
    uint64_t s = 0;
    for (size_t i = 0; i < len; i++)
        s += b[i] * ipc_sum_weight(i);
    return s;
}

/* Word w of the fill is splitmix64(seed, w); ipc_gpu_util.cu does the same. */
void ipc_fill_host(void *p, size_t len, uint64_t seed)
{
    uint8_t *b = p;
    for (size_t w = 0; w * 8 < len; w++) {
        uint64_t z = seed + (w + 1) * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        memcpy(b + w * 8, &z, len - w * 8 < 8 ? len - w * 8 : 8);
    }
}

static int read_line(struct owner *o, char *buf, size_t len, int timeout_ms)
{
    for (;;) {
        char *nl = memchr(o->rbuf, '\n', o->rlen);
        if (nl) {
            size_t n = (size_t)(nl - o->rbuf);
            size_t c = n < len - 1 ? n : len - 1;
            memcpy(buf, o->rbuf, c);
            buf[c] = 0;
            memmove(o->rbuf, nl + 1, o->rlen - n - 1);
            o->rlen -= n + 1;
            return 0;
        }
        if (o->rlen == sizeof(o->rbuf))
            return -1;
        struct pollfd p = {.fd = o->from, .events = POLLIN};
        int r = poll(&p, 1, timeout_ms);
        if (r == 0) {
            fprintf(stderr, "owner: no answer within %d ms\n", timeout_ms);
            return -1;
        }
        if (r < 0 && errno == EINTR)
            continue;
        ssize_t n = read(o->from, o->rbuf + o->rlen, sizeof(o->rbuf) - o->rlen);
        if (n <= 0) {
            fprintf(stderr, "owner: pipe closed (child died?)\n");
            return -1;
        }
        o->rlen += (size_t)n;
    }
}

static int parse_region(struct owner *o, const char *line)
{
    if (o->nregions == (int)(sizeof(o->regions) / sizeof(o->regions[0])))
        return -1;
    struct xfer_region_desc d;
    memset(&d, 0, sizeof(d));
    int kind;
    unsigned long long addr, len;
    if (sscanf(line, "REGION %63s %u %u %d %d %llx %llu %u %255s", d.name, &d.id, &d.gen, &kind,
               &d.device, &addr, &len, &d.access, d.ipc) != 9)
        return -1;
    d.kind = (enum xfer_mem_kind)kind;
    d.addr = addr;
    d.len = len;
    for (int i = 0; i < o->nregions; i++)
        if (!strcmp(o->regions[i].name, d.name)) {
            o->regions[i] = d;
            return 0;
        }
    o->regions[o->nregions++] = d;
    return 0;
}

static int parse_peer(struct owner *o, const char *line)
{
    struct xfer_peer_desc *d = &o->desc;
    memset(d, 0, sizeof(*d));
    unsigned port;
    unsigned long long inc;
    if (sscanf(line, "PEER %63s %63s %llx %x %63s %u", d->node_id, d->host_id, &inc, &d->transports,
               d->addr, &port) != 6)
        return -1;
    d->incarnation = inc;
    d->data_port = (uint16_t)port;
    return 0;
}

int owner_start(struct owner *o, const char *const *args)
{
    memset(o, 0, sizeof(*o));
    int to[2], from[2];
    if (pipe2(to, O_CLOEXEC) < 0 || pipe2(from, O_CLOEXEC) < 0)
        return -1;
    const char *argv[48] = {"ipc_node", "serve"};
    int n = 2;
    for (int i = 0; args[i] && n < 47; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    o->pid = fork();
    if (o->pid == 0) {
        dup2(to[0], 0);
        dup2(from[1], 1);
        /* Lets a test show the owner GPUs the initiator cannot see. */
        const char *cvd = getenv("IPC_OWNER_CUDA_VISIBLE_DEVICES");
        if (cvd)
            setenv("CUDA_VISIBLE_DEVICES", cvd, 1);
        /* Lets a test run the owner as another user. */
        const char *uid = getenv("IPC_OWNER_UID");
        if (uid && (setgid((gid_t)atoi(uid)) < 0 || setuid((uid_t)atoi(uid)) < 0))
            _exit(126);
        execv("/proc/self/exe", (char *const *)argv);
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    o->to = to[1];
    o->from = from[0];
    if (o->pid < 0)
        return -1;
    char line[512];
    while (read_line(o, line, sizeof(line), ANSWER_TIMEOUT_MS) == 0) {
        if (!strncmp(line, "PEER ", 5) && parse_peer(o, line) < 0)
            break;
        if (!strncmp(line, "REGION ", 7) && parse_region(o, line) < 0)
            break;
        if (!strcmp(line, "READY"))
            return 0;
        if (!strncmp(line, "ERR", 3)) {
            fprintf(stderr, "owner: %s\n", line);
            break;
        }
    }
    owner_stop(o);
    return -1;
}

int owner_cmd(struct owner *o, char *buf, size_t len, const char *fmt, ...)
{
    char cmd[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(cmd, sizeof(cmd) - 1, fmt, ap);
    va_end(ap);
    cmd[n++] = '\n';
    if (write(o->to, cmd, (size_t)n) != n)
        return -1;
    if (read_line(o, buf, len, ANSWER_TIMEOUT_MS) < 0)
        return -1;
    if (!strncmp(buf, "REGION ", 7))
        return parse_region(o, buf);
    return strncmp(buf, "ERR", 3) ? 0 : -1;
}

int owner_sum(struct owner *o, const char *name, uint64_t off, uint64_t len, uint64_t *out)
{
    char buf[256];
    unsigned long long v;
    if (owner_cmd(o, buf, sizeof(buf), "SUM %s %" PRIu64 " %" PRIu64, name, off, len) < 0 ||
        sscanf(buf, "SUM %llx", &v) != 1) {
        fprintf(stderr, "owner SUM failed: %s\n", buf);
        return -1;
    }
    *out = v;
    return 0;
}

int owner_stop(struct owner *o)
{
    if (o->pid <= 0)
        return -1;
    if (write(o->to, "QUIT\n", 5) < 0)
        kill(o->pid, SIGTERM);
    close(o->to);
    int st = 0;
    for (int i = 0; i < 1000; i++) { /* up to 10 s, then kill */
        if (waitpid(o->pid, &st, WNOHANG) == o->pid)
            goto reaped;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    kill(o->pid, SIGKILL);
    waitpid(o->pid, &st, 0);
reaped:
    close(o->from);
    o->pid = 0;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

const struct xfer_region_desc *owner_region(const struct owner *o, const char *name)
{
    for (int i = 0; i < o->nregions; i++)
        if (!strcmp(o->regions[i].name, name))
            return &o->regions[i];
    return NULL;
}

xfer_engine *driver_engine(const char *node, struct owner *o, xfer_peer **peer)
{
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = node;
    const char *secret = getenv("IPC_TEST_SECRET");
    if (secret) {
        cfg.secret = secret;
        cfg.secret_len = strlen(secret);
    }
    const char *io = getenv("IPC_TEST_IO_TIMEOUT_MS");
    if (io)
        cfg.io_timeout_ms = atoi(io);
    int err = 0;
    xfer_engine *e = xfer_engine_new(&cfg, &err);
    if (!e) {
        fprintf(stderr, "engine: %s\n", xfer_strerror(err));
        return NULL;
    }
    if (xfer_peer_add(e, &o->desc, peer) < 0 && !*peer) {
        fprintf(stderr, "peer_add: %s\n", xfer_engine_last_error(e));
        xfer_engine_free(e);
        return NULL;
    }
    for (int i = 0; i < o->nregions; i++)
        xfer_peer_region_add(*peer, &o->regions[i]);
    return e;
}

static int usage(void)
{
    fprintf(stderr, "usage: ipc_node host|gpu|bench|serve [options]\n"
                    "  host   [--iters N] [--seed S] [--expect tcp|ipc]   host-memory tests\n"
                    "  gpu    the CUDA matrix (exit 77 without a CUDA device)\n"
                    "  faults deadline, cancel, stopped and killed owner\n"
                    "  bench  [--host-mib N] [--gpu] [--gpu-mib N] [--no-host] [--best N]\n"
                    "         [--round-gib N]\n"
                    "         ipc vs memcpy / cudaMemcpyPeerAsync (XFER_IPC_STREAMS,\n"
                    "         XFER_IPC_COPY_ON=owner|sender, XFER_IPC_GROUP_MIB select the\n"
                    "         CUDA copy variant; each row: best of N rounds, both sides)\n");
    return 2;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc < 2)
        return usage();
    if (!strcmp(argv[1], "serve"))
        return run_serve(argc - 2, argv + 2);
    if (!strcmp(argv[1], "host"))
        return run_host_tests(argc - 2, argv + 2);
    if (!strcmp(argv[1], "gpu"))
        return run_gpu_tests(argc - 2, argv + 2);
    if (!strcmp(argv[1], "bench"))
        return run_bench(argc - 2, argv + 2);
    if (!strcmp(argv[1], "faults"))
        return run_fault_tests(argc - 2, argv + 2);
    return usage();
}
