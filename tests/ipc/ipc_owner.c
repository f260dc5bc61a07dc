/*
 * `ipc_node serve`: the owner process. Registers the regions named on the
 * command line (name:kind:len:access, kind = memfd | cma | cuda<N> | cumem<N>),
 * prints its peer and region descriptors, then answers one command per line
 * on stdin until QUIT or EOF:
 *   SUM name off len   -> SUM <hex>     checksum of the range (on the GPU for cuda)
 *   FILL name seed     -> OK            deterministic fill of the whole region
 *   DEREG name         -> OK
 *   REREG name         -> REGION ...    registers it again (new generation)
 *   CUFREE name        -> OK            frees the GPU memory, registration kept
 *                                       (a user error the transport must report)
 *   SHRINK name        -> ERR why | SHRUNK  ftruncate(0) of the region's memfd, as a
 *                                       client holding it could (kind adopt: the
 *                                       client's own fd; kind memfd: the engine's)
 *   ADOPTRAW name len  -> ERR why | OK  adopts a memfd made without MFD_ALLOW_SEALING
 *   GUARD name         -> OK            guards the whole region with a lease for
 *                                       another node (the driver is refused)
 *   UNGUARD name       -> OK            drops every lease rule of the region
 *   DEREGWATCH name ms -> OK took_ms | ERR why  (kind adopt) deregisters, then
 *                                       watches the client's memfd for ms: any
 *                                       change after deregistration returned is
 *                                       a peer copying too late
 * Kind adopt is a client's memfd made with MFD_ALLOW_SEALING, left unsealed,
 * adopted with xfer_region_adopt_memfd and kept open here.
 */
#include "ipc_test.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

struct oregion {
    char name[XFER_NAME_MAX];
    char kind[16];
    size_t len;
    unsigned access;
    int dev; /* -1 host */
    bool cumem;
    void *mem;   /* caller memory (cma/cuda), NULL for memfd */
    int keep_fd; /* kind adopt: the client's copy of the memfd, else -1 */
    xfer_region *r;
};

static struct oregion regs[16];
static int nregs;

static void print_region(const struct oregion *o)
{
    struct xfer_region_desc d;
    xfer_region_describe(o->r, &d);
    printf("REGION %s %u %u %d %d %llx %llu %u %s\n", d.name, d.id, d.gen, (int)d.kind, d.device,
           (unsigned long long)d.addr, (unsigned long long)d.len, d.access, d.ipc[0] ? d.ipc : "-");
    fflush(stdout);
}

static int fill(struct oregion *o, uint64_t seed)
{
    if (o->dev >= 0)
        return ipc_gpu_fill(o->dev, xfer_region_ptr(o->r), o->len, seed);
    ipc_fill_host(xfer_region_ptr(o->r), o->len, seed);
    return 0;
}

/* A memfd made by a client and adopted; returns the client's fd or -errno. */
static int adopt(xfer_engine *e, const char *name, size_t len, unsigned access, unsigned flags,
                 xfer_region **r)
{
    int fd = memfd_create(name, MFD_CLOEXEC | flags);
    if (fd < 0 || ftruncate(fd, (off_t)len) < 0) {
        if (fd >= 0)
            close(fd);
        return -XFER_EIO;
    }
    int keep = dup(fd);
    int rc = keep < 0 ? -XFER_EIO : xfer_region_adopt_memfd(e, name, fd, len, access, r);
    if (rc < 0) {
        close(fd);
        if (keep >= 0)
            close(keep);
        return rc;
    }
    return keep;
}

static int do_register(xfer_engine *e, struct oregion *o)
{
    if (!strcmp(o->kind, "adopt")) {
        if (o->keep_fd >= 0)
            close(o->keep_fd);
        o->keep_fd = adopt(e, o->name, o->len, o->access, MFD_ALLOW_SEALING, &o->r);
        return o->keep_fd < 0 ? o->keep_fd : 0;
    }
    if (!strcmp(o->kind, "memfd"))
        return xfer_region_alloc(e, o->name, o->len, o->access, &o->r);
    if (!o->mem) {
        if (o->dev >= 0) {
            if (ipc_gpu_alloc(o->dev, o->len, o->cumem, &o->mem) < 0)
                return -XFER_ENODEV;
        } else if (!(o->mem = malloc(o->len))) {
            return -XFER_ENOMEM;
        }
    }
    return xfer_region_register(e, o->name, o->mem, o->len,
                                o->dev >= 0 ? XFER_MEM_CUDA : XFER_MEM_HOST, o->dev, o->access,
                                &o->r);
}

static int add_region(xfer_engine *e, const char *spec)
{
    struct oregion *o = &regs[nregs];
    char acc[8];
    unsigned long long len;
    memset(o, 0, sizeof(*o));
    if (nregs == 16 || sscanf(spec, "%63[^:]:%15[^:]:%llu:%7s", o->name, o->kind, &len, acc) != 4 ||
        xfer_access_parse(acc, &o->access) < 0)
        return -XFER_EINVAL;
    o->len = len;
    o->dev = -1;
    o->keep_fd = -1;
    if (!strncmp(o->kind, "cuda", 4))
        o->dev = atoi(o->kind + 4);
    if (!strncmp(o->kind, "cumem", 5)) {
        o->dev = atoi(o->kind + 5);
        o->cumem = true;
    }
    int rc = do_register(e, o);
    if (rc == 0)
        rc = fill(o, (uint64_t)nregs + 1);
    if (rc == 0)
        nregs++;
    return rc;
}

static struct oregion *find(const char *name)
{
    for (int i = 0; i < nregs; i++)
        if (!strcmp(regs[i].name, name))
            return &regs[i];
    return NULL;
}

static uint64_t fd_sum(int fd, size_t len, char *buf)
{
    return pread(fd, buf, len, 0) == (ssize_t)len ? ipc_sum_host(buf, len) : 0;
}

static double mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void deregwatch(xfer_engine *e, struct oregion *o, int watch_ms)
{
    char *buf = o->keep_fd >= 0 && o->r ? malloc(o->len) : NULL;
    if (!buf) {
        printf("ERR not a registered adopted region\n");
        return;
    }
    double t0 = mono_ms();
    int rc = xfer_region_deregister(e, o->r);
    double took = mono_ms() - t0;
    o->r = NULL;
    uint64_t before = fd_sum(o->keep_fd, o->len, buf), after = before;
    for (double end = mono_ms() + watch_ms; rc == 0 && after == before && mono_ms() < end;)
        after = fd_sum(o->keep_fd, o->len, buf);
    if (rc)
        printf("ERR %s\n", xfer_strerror(rc));
    else if (after != before)
        printf("ERR memory changed after deregistration returned\n");
    else
        printf("OK %.1f\n", took);
    free(buf);
}

static void answer(xfer_engine *e, char *line)
{
    char name[XFER_NAME_MAX];
    unsigned long long a = 0, b = 0;
    struct oregion *o = NULL;
    if (sscanf(line, "%*s %63s %llu %llu", name, &a, &b) >= 1)
        o = find(name);
    if (!strncmp(line, "ADOPTRAW ", 9)) {
        xfer_region *r = NULL;
        int fd = adopt(e, name, a, XFER_ACCESS_RW, 0, &r);
        if (fd >= 0)
            close(fd);
        printf(fd >= 0 ? "OK\n" : "ERR %s\n", xfer_engine_last_error(e));
    } else if (!o) {
        printf("ERR unknown region\n");
    } else if (!strncmp(line, "SUM ", 4)) {
        uint64_t s = 0;
        int rc = 0;
        if (!o->r || !xfer_range_ok(a, b, o->len))
            rc = -1;
        else if (o->dev >= 0)
            rc = ipc_gpu_sum(o->dev, (char *)xfer_region_ptr(o->r) + a, b, &s);
        else
            s = ipc_sum_host((char *)xfer_region_ptr(o->r) + a, b);
        printf(rc ? "ERR sum\n" : "SUM %" PRIx64 "\n", s);
    } else if (!strncmp(line, "FILL ", 5)) {
        printf(o->r && fill(o, a) == 0 ? "OK\n" : "ERR fill\n");
    } else if (!strncmp(line, "GUARD ", 6)) {
        int err = 0;
        xfer_lease *l = o->r ? xfer_lease_new(e, "someone-else", 600000, &err) : NULL;
        struct xfer_range all = {0, o->len};
        if (l)
            err = xfer_lease_add(l, o->r, &all, 1);
        xfer_lease_free(l); /* the range stays guarded */
        printf(l && !err ? "OK\n" : "ERR %s\n", xfer_strerror(l ? err : -XFER_ENOENT));
    } else if (!strncmp(line, "UNGUARD ", 8)) {
        printf(o->r && xfer_region_unguard(o->r) == 0 ? "OK\n" : "ERR unguard\n");
    } else if (!strncmp(line, "DEREGWATCH ", 11)) {
        deregwatch(e, o, (int)a);
    } else if (!strncmp(line, "DEREG ", 6)) {
        int rc = o->r ? xfer_region_deregister(e, o->r) : -XFER_ENOENT;
        o->r = NULL;
        printf(rc ? "ERR %s\n" : "OK\n", xfer_strerror(rc));
    } else if (!strncmp(line, "SHRINK ", 7)) {
        int fd = o->keep_fd >= 0 ? o->keep_fd : o->r ? xfer_region_memfd(o->r) : -1;
        if (fd < 0)
            printf("ERR no memfd\n");
        else if (ftruncate(fd, 0) < 0)
            printf("ERR %s\n", strerror(errno));
        else
            printf("SHRUNK\n");
    } else if (!strncmp(line, "CUFREE ", 7)) {
        if (o->dev >= 0 && o->mem)
            ipc_gpu_free(o->dev, o->mem, o->cumem, o->len);
        o->mem = NULL;
        printf("OK\n");
    } else if (!strncmp(line, "REREG ", 6)) {
        int rc = o->r ? -XFER_EEXIST : do_register(e, o);
        if (rc == 0)
            print_region(o);
        else
            printf("ERR %s\n", xfer_strerror(rc));
    } else {
        printf("ERR unknown command\n");
    }
    fflush(stdout);
}

int run_serve(int argc, char **argv)
{
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    char node[XFER_NAME_MAX];
    snprintf(node, sizeof(node), "owner-%d", (int)getpid());
    cfg.node_id = node;
    const char *secret = getenv("IPC_TEST_SECRET");
    if (secret) {
        cfg.secret = secret;
        cfg.secret_len = strlen(secret);
    }
    int i = 0;
    if (argc > 0 && !strcmp(argv[0], "--nodump")) {
        prctl(PR_SET_DUMPABLE, 0); /* only CAP_SYS_PTRACE may attach now */
        i++;
    }
    int err = 0;
    xfer_engine *e = xfer_engine_new(&cfg, &err);
    if (!e) {
        printf("ERR engine: %s\n", xfer_strerror(err));
        return 1;
    }
    for (; i < argc; i++) {
        int rc = add_region(e, argv[i]);
        if (rc < 0) {
            printf("ERR region %s: %s\n", argv[i], xfer_strerror(rc));
            xfer_engine_free(e);
            return rc == -XFER_ENODEV ? 77 : 1;
        }
    }
    struct xfer_peer_desc self;
    xfer_engine_describe(e, &self);
    printf("PEER %s %s %llx %x %s %u\n", self.node_id, self.host_id,
           (unsigned long long)self.incarnation, self.transports, self.addr, self.data_port);
    for (int k = 0; k < nregs; k++)
        print_region(&regs[k]);
    printf("READY\n");
    fflush(stdout);
    char line[256];
    /* The driver answers within seconds; an idle minute means it is gone. */
    struct pollfd p = {.fd = 0, .events = POLLIN};
    while (poll(&p, 1, 120000) > 0 && fgets(line, sizeof(line), stdin)) {
        line[strcspn(line, "\n")] = 0;
        if (!strcmp(line, "QUIT"))
            break;
        answer(e, line);
    }
    xfer_engine_free(e);
    for (int k = 0; k < nregs; k++)
        if (regs[k].dev >= 0 && regs[k].mem)
            ipc_gpu_free(regs[k].dev, regs[k].mem, regs[k].cumem, regs[k].len);
        else
            free(regs[k].mem);
    return 0;
}
