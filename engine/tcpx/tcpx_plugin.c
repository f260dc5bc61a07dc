/* Loading an NCCL net plugin and calling it whatever its struct version. */
#include "tcpx_plugin.h"
#include "xfer.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define V7(n)  ((const struct xnccl_net_v7 *)(n)->vt)
#define V8(n)  ((const struct xnccl_net_v8 *)(n)->vt)
#define V9(n)  ((const struct xnccl_net_v9 *)(n)->vt)
#define V10(n) ((const struct xnccl_net_v10 *)(n)->vt)
#define V11(n) ((const struct xnccl_net_v11 *)(n)->vt)
#define V12(n) ((const struct xnccl_net_v12 *)(n)->vt)

/* Calls member m of the struct whatever its version, for members whose
 * signature is the same in every version. */
#define CALL_SAME(n, m, ...)                                                                       \
    ((n)->version == 7    ? V7(n)->m(__VA_ARGS__)                                                  \
     : (n)->version == 8  ? V8(n)->m(__VA_ARGS__)                                                  \
     : (n)->version == 9  ? V9(n)->m(__VA_ARGS__)                                                  \
     : (n)->version == 10 ? V10(n)->m(__VA_ARGS__)                                                 \
     : (n)->version == 11 ? V11(n)->m(__VA_ARGS__)                                                 \
                          : V12(n)->m(__VA_ARGS__))
#define MEMBER(n, m)                                                                               \
    ((n)->version == 7    ? (const void *)V7(n)->m                                                 \
     : (n)->version == 8  ? (const void *)V8(n)->m                                                 \
     : (n)->version == 9  ? (const void *)V9(n)->m                                                 \
     : (n)->version == 10 ? (const void *)V10(n)->m                                                \
     : (n)->version == 11 ? (const void *)V11(n)->m                                                \
                          : (const void *)V12(n)->m)

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct tcpx_net *g_net;

const char *tcpx_net_result_str(int r)
{
    static const char *const names[] = {"success",        "unhandled CUDA error", "system error",
                                        "internal error", "invalid argument",     "invalid usage",
                                        "remote error",   "in progress"};
    return r >= 0 && r < (int)(sizeof(names) / sizeof(names[0])) ? names[r] : "unknown result";
}

/* The plugin's log lines go to xfer's log: WARN as warnings, the rest
 * (INFO, TRACE, VERSION) at debug level. */
static void plugin_log(int level, unsigned long flags, const char *file, int line, const char *fmt,
                       ...)
{
    (void)flags;
    enum xfer_log_level lvl = level == 2 ? XFER_LOG_WARN : XFER_LOG_DEBUG;
    if (lvl > xfer_log_get_level())
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    xfer_log_write(lvl, file ? file : "plugin", line, "tcpx plugin: %s", msg);
}

static void props_from(struct tcpx_net_props *p, const char *name, int ptr, int regg, int flush,
                       int speed, int max_recvs, int type, int ver)
{
    snprintf(p->name, sizeof(p->name), "%s", name ? name : "?");
    p->ptr_support = ptr;
    p->reg_is_global = regg;
    p->force_flush = flush;
    p->speed_mbps = speed;
    p->max_recvs = max_recvs;
    p->net_device_type = type;
    p->net_device_version = ver;
}

static int get_props(struct tcpx_net *n)
{
    int r;
    struct tcpx_net_props *p = &n->props;
    if (n->version == 7) {
        struct xnccl_props_v7 q = {0};
        if ((r = V7(n)->get_properties(n->dev, &q)) == 0)
            props_from(p, q.name, q.ptr_support, 0, 0, q.speed, q.max_recvs, q.net_device_type,
                       q.net_device_version);
    } else if (n->version == 8) {
        struct xnccl_props_v8 q = {0};
        if ((r = V8(n)->get_properties(n->dev, &q)) == 0)
            props_from(p, q.name, q.ptr_support, q.reg_is_global, 0, q.speed, q.max_recvs,
                       q.net_device_type, q.net_device_version);
    } else if (n->version <= 11) {
        struct xnccl_props_v11 q = {0}; /* v9 and v10 fill its first part */
        r = n->version == 9    ? V9(n)->get_properties(n->dev, &q.v9)
            : n->version == 10 ? V10(n)->get_properties(n->dev, &q.v9)
                               : V11(n)->get_properties(n->dev, &q);
        if (r == 0)
            props_from(p, q.v9.name, q.v9.ptr_support, q.v9.reg_is_global, q.v9.force_flush,
                       q.v9.speed, q.v9.max_recvs, q.v9.net_device_type, q.v9.net_device_version);
    } else {
        struct xnccl_props_v12 q = {0};
        if ((r = V12(n)->get_properties(n->dev, &q)) == 0)
            props_from(p, q.name, q.ptr_support, q.reg_is_global, q.force_flush, q.speed,
                       q.max_recvs, q.net_device_type, q.net_device_version);
    }
    return r;
}

static int plugin_init(struct tcpx_net *n)
{
    if (n->version <= 9)
        return n->version == 7   ? V7(n)->init(plugin_log)
               : n->version == 8 ? V8(n)->init(plugin_log)
                                 : V9(n)->init(plugin_log);
    if (n->version == 10)
        return V10(n)->init(plugin_log, NULL);
    struct xnccl_comm_config cfg = {.traffic_class = -1};
    return n->version == 11 ? V11(n)->init(&n->ctx, 0, &cfg, plugin_log, NULL)
                            : V12(n)->init(&n->ctx, 0, &cfg, plugin_log, NULL);
}

static void plugin_finalize(struct tcpx_net *n)
{
    if (n->version == 11 && V11(n)->finalize)
        (void)V11(n)->finalize(n->ctx);
    else if (n->version == 12 && V12(n)->finalize)
        (void)V12(n)->finalize(n->ctx);
}

/* The newest struct we know (or exactly `want`), and its version. */
static const void *find_struct(void *dl, int want, int *version)
{
    for (int v = XNCCL_NET_VERSION_MAX; v >= XNCCL_NET_VERSION_MIN; v--) {
        if (want && v != want)
            continue;
        char sym[32];
        snprintf(sym, sizeof(sym), XNCCL_NET_SYMBOL_FMT, v);
        const void *vt = dlsym(dl, sym);
        if (vt) {
            *version = v;
            return vt;
        }
    }
    return NULL;
}

/* Every function xfer calls must be there (regMrDmaBuf, getDeviceMr and
 * irecvConsumed are optional). */
static bool complete(const struct tcpx_net *n)
{
    const void *need[] = {MEMBER(n, init),       MEMBER(n, devices),     MEMBER(n, get_properties),
                          MEMBER(n, listen),     MEMBER(n, connect),     MEMBER(n, accept),
                          MEMBER(n, reg_mr),     MEMBER(n, dereg_mr),    MEMBER(n, isend),
                          MEMBER(n, irecv),      MEMBER(n, test),        MEMBER(n, close_send),
                          MEMBER(n, close_recv), MEMBER(n, close_listen)};
    for (size_t i = 0; i < sizeof(need) / sizeof(need[0]); i++)
        if (!need[i])
            return false;
    return true;
}

static int env_int(const char *name, int def)
{
    const char *s = getenv(name);
    return s && *s ? atoi(s) : def;
}

static int load(struct tcpx_net *n, const char *path, int want, char *why, size_t wl)
{
    snprintf(n->path, sizeof(n->path), "%s", path);
    n->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!n->dl) {
        snprintf(why, wl, "no NCCL net plugin: %s", dlerror());
        return -XFER_ENOTSUP;
    }
    n->vt = find_struct(n->dl, want, &n->version);
    if (!n->vt) {
        snprintf(why, wl, "%s exports no ncclNetPlugin_v%d%s", path, want ? want : 12,
                 want ? "" : "..v7 struct");
        return -XFER_ENOTSUP;
    }
    if (!complete(n)) {
        snprintf(why, wl, "%s: its v%d struct lacks functions xfer needs", path, n->version);
        return -XFER_ENOTSUP;
    }
    int r = plugin_init(n);
    if (r != 0) {
        snprintf(why, wl, "%s (v%d): init failed: %s", path, n->version, tcpx_net_result_str(r));
        return -XFER_ENOTSUP;
    }
    n->ndev = 0;
    r = CALL_SAME(n, devices, &n->ndev);
    n->dev = env_int("XFER_TCPX_DEV", 0);
    if (r != 0 || n->ndev < 1 || n->dev < 0 || n->dev >= n->ndev) {
        snprintf(why, wl, "%s (v%d): %d device(s)%s, device %d wanted", path, n->version,
                 r ? 0 : n->ndev, r ? " (devices() failed)" : "", n->dev);
        plugin_finalize(n);
        return -XFER_ENOTSUP;
    }
    if ((r = get_props(n)) != 0) {
        snprintf(why, wl, "%s: getProperties(%d): %s", path, n->dev, tcpx_net_result_str(r));
        plugin_finalize(n);
        return -XFER_ENOTSUP;
    }
    return 0;
}

int tcpx_net_get(const char *path, int version, struct tcpx_net **out, char *why, size_t wl)
{
    if (!path)
        path = getenv("XFER_TCPX_PLUGIN");
    if (!path || !*path)
        path = TCPX_PLUGIN_DEFAULT;
    if (!version)
        version = env_int("XFER_TCPX_NET_VERSION", 0);
    pthread_mutex_lock(&g_mu);
    int rc = 0;
    if (g_net) {
        if (strcmp(g_net->path, path) || (version && version != g_net->version)) {
            snprintf(why, wl, "another plugin (%s v%d) is loaded in this process", g_net->path,
                     g_net->version);
            rc = -XFER_EBUSY;
        } else {
            g_net->refs++;
        }
    } else {
        struct tcpx_net *n = calloc(1, sizeof(*n));
        rc = n ? load(n, path, version, why, wl) : -XFER_ENOMEM;
        if (rc == 0) {
            n->refs = 1;
            g_net = n;
        } else if (n) {
            if (n->dl)
                dlclose(n->dl);
            free(n);
        }
    }
    *out = rc == 0 ? g_net : NULL;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

void tcpx_net_put(struct tcpx_net *n)
{
    if (!n)
        return;
    pthread_mutex_lock(&g_mu);
    if (--n->refs == 0) {
        plugin_finalize(n);
        dlclose(n->dl);
        free(n);
        g_net = NULL;
    }
    pthread_mutex_unlock(&g_mu);
}

int tcpx_net_listen(struct tcpx_net *n, void *handle, void **lc)
{
    if (n->version <= 10)
        return n->version == 10  ? V10(n)->listen(n->dev, handle, lc)
               : n->version == 9 ? V9(n)->listen(n->dev, handle, lc)
               : n->version == 8 ? V8(n)->listen(n->dev, handle, lc)
                                 : V7(n)->listen(n->dev, handle, lc);
    return n->version == 11 ? V11(n)->listen(n->ctx, n->dev, handle, lc)
                            : V12(n)->listen(n->ctx, n->dev, handle, lc);
}

int tcpx_net_connect(struct tcpx_net *n, void *handle, void **sc, xnccl_dh **dev)
{
    struct xnccl_comm_config cfg = {.traffic_class = -1};
    switch (n->version) {
    case 7:
        return V7(n)->connect(n->dev, handle, sc, dev);
    case 8:
        return V8(n)->connect(n->dev, handle, sc, dev);
    case 9:
        return V9(n)->connect(n->dev, handle, sc, dev);
    case 10:
        return V10(n)->connect(n->dev, &cfg, handle, sc, dev);
    case 11:
        return V11(n)->connect(n->ctx, n->dev, handle, sc, dev);
    default:
        return V12(n)->connect(n->ctx, n->dev, handle, sc, dev);
    }
}

int tcpx_net_accept(struct tcpx_net *n, void *lc, void **rc, xnccl_dh **dev)
{
    return CALL_SAME(n, accept, lc, rc, dev);
}

int tcpx_net_reg_mr(struct tcpx_net *n, void *comm, void *data, size_t size, int type, void **mh)
{
    if (n->version == 7) {
        if (size > INT_MAX)
            return XNCCL_INVALID_ARGUMENT;
        return V7(n)->reg_mr(comm, data, (int)size, type, mh);
    }
    return n->version == 8    ? V8(n)->reg_mr(comm, data, size, type, mh)
           : n->version == 9  ? V9(n)->reg_mr(comm, data, size, type, mh)
           : n->version == 10 ? V10(n)->reg_mr(comm, data, size, type, mh)
           : n->version == 11 ? V11(n)->reg_mr(comm, data, size, type, mh)
                              : V12(n)->reg_mr(comm, data, size, type, mh);
}

int tcpx_net_dereg_mr(struct tcpx_net *n, void *comm, void *mh)
{
    return CALL_SAME(n, dereg_mr, comm, mh);
}

int tcpx_net_isend(struct tcpx_net *n, void *comm, void *data, size_t size, int tag, void *mh,
                   void **req)
{
    if (n->version <= 8 && size > INT_MAX)
        return XNCCL_INVALID_ARGUMENT;
    switch (n->version) {
    case 7:
        return V7(n)->isend(comm, data, (int)size, tag, mh, req);
    case 8:
        return V8(n)->isend(comm, data, (int)size, tag, mh, req);
    case 9:
        return V9(n)->isend(comm, data, size, tag, mh, req);
    case 10:
        return V10(n)->isend(comm, data, size, tag, mh, NULL, req);
    case 11:
        return V11(n)->isend(comm, data, size, tag, mh, NULL, req);
    default:
        return V12(n)->isend(comm, data, size, tag, mh, NULL, req);
    }
}

int tcpx_net_irecv(struct tcpx_net *n, void *comm, void *data, size_t size, int tag, void *mh,
                   void **req)
{
    void *ph = NULL;
    if (n->version <= 8) {
        if (size > INT_MAX)
            return XNCCL_INVALID_ARGUMENT;
        int isz = (int)size;
        return n->version == 7 ? V7(n)->irecv(comm, 1, &data, &isz, &tag, &mh, req)
                               : V8(n)->irecv(comm, 1, &data, &isz, &tag, &mh, req);
    }
    switch (n->version) {
    case 9:
        return V9(n)->irecv(comm, 1, &data, &size, &tag, &mh, req);
    case 10:
        return V10(n)->irecv(comm, 1, &data, &size, &tag, &mh, &ph, req);
    case 11:
        return V11(n)->irecv(comm, 1, &data, &size, &tag, &mh, &ph, req);
    default:
        return V12(n)->irecv(comm, 1, &data, &size, &tag, &mh, &ph, req);
    }
}

int tcpx_net_iflush(struct tcpx_net *n, void *comm, void *data, int size, void *mh, void **req)
{
    *req = NULL;
    if (!MEMBER(n, iflush))
        return 0;
    return CALL_SAME(n, iflush, comm, 1, &data, &size, &mh, req);
}

int tcpx_net_test(struct tcpx_net *n, void *req, int *done, int *size)
{
    return CALL_SAME(n, test, req, done, size);
}

bool tcpx_net_has_consumed(const struct tcpx_net *n)
{
    return MEMBER(n, irecv_consumed) != NULL;
}

int tcpx_net_irecv_consumed(struct tcpx_net *n, void *comm, void *req)
{
    if (!tcpx_net_has_consumed(n))
        return 0;
    return CALL_SAME(n, irecv_consumed, comm, 1, req);
}

int tcpx_net_close_send(struct tcpx_net *n, void *comm)
{
    return CALL_SAME(n, close_send, comm);
}

int tcpx_net_close_recv(struct tcpx_net *n, void *comm)
{
    return CALL_SAME(n, close_recv, comm);
}

int tcpx_net_close_listen(struct tcpx_net *n, void *comm)
{
    return CALL_SAME(n, close_listen, comm);
}
