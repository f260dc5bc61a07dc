/* xferctl internals shared by xferctl_main.c (options, listings, simple
 * commands) and xferctl_data.c (put/get staging, batch, probe, bench). */
#ifndef XFER_SERVICE_XFERCTL_H
#define XFER_SERVICE_XFERCTL_H

#include "ctl_client.h"
#include "xfer_io.h"

#include <stdbool.h>
#include <stdint.h>

#define EXIT_FAIL  1
#define EXIT_USAGE 2
#define INLINE_MAX (XFER_FRAME_MAX - 4096)
#define STAGE_MAX  (8u << 20)

struct xferctl_opts {
    const char *socket, *node, *connect, *secret, *access, *layout, *op;
    const char *cuda_ipc; /* register: hex of a cudaIpcMemHandle_t */
    const char *notify;   /* copy: bound notification text */
    const char *layers;   /* pool copy: "A-B" */
    int gpu;
    uint64_t cuda_offset;
    int timeout_ms;
    bool json, async, prometheus;
    bool timeout_set; /* --timeout given (listen: how long to listen) */
    uint64_t size, count, depth, batch;
};
extern struct xferctl_opts xctl_opt; /* parsed options */
extern struct ctl_client *xctl_cli;  /* connection to the xferd */

/* Prints "xferctl: ..." on stderr and returns code. */
int xctl_die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* One request (pass fd when >= 0); prints the reason and returns non-zero
 * on any failure, else *r is the response (xctl__response__free_unpacked). */
int xctl_call(Xctl__Request *req, int fd, Xctl__Response **r);
int xctl_parse_len(const char *s, uint64_t *out);
int xctl_check_addr(const char *s);
int xctl_get_health(Xctl__Response **r);
int xctl_register(const char *name, uint64_t len, const char *access, int fd, bool priv);
int xctl_deregister(const char *name);
uint32_t xctl_server_deadline(void);
Xctl__Op xctl_parse_op(void);
/* One named transfer, waited for; *out (if given) gets the response. */
int xctl_transfer(const char *src, const char *dst, uint64_t len, Xctl__Op op, uint32_t repeat,
                  bool async, const char *notify, Xctl__Response **out);

int xctl_cmd_batch(const char *file);
int xctl_cmd_put(const char *file, const char *addr);
int xctl_cmd_get(const char *addr, const char *lens, const char *file);
int xctl_cmd_probe(const char *src, const char *dst);
int xctl_cmd_bench(const char *src, const char *dst);
/* xferctl_notify.c */
int xctl_cmd_notify(const char *node, const char *text);
int xctl_cmd_listen(void);
/* xferctl_pools.c */
int xctl_cmd_pools(const char *node);
int xctl_cmd_pool_create(const char *name, const char *spec);
int xctl_cmd_pool_delete(const char *name);
int xctl_cmd_pool_copy(const char *src, const char *dst);

#endif
