/* Two engines in two processes over tcp (test_notif_ack, test_send_local):
 * each makes its engine, the descriptions cross over a pair of pipes, and
 * each adds and connects the other as a peer. */
#ifndef XFER_TEST_FORK_PAIR_H
#define XFER_TEST_FORK_PAIR_H

#include "xfer.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static inline int64_t fp_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Engine `me` (tcp, `socks` sockets per peer, `threads` progress threads),
 * its peer the process at the other end of rfd/wfd. 0 or -1. */
static inline int fp_side_up_n(xfer_engine **e, xfer_peer **p, const char *me, int rfd, int wfd,
                               int socks, int threads)
{
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.transports = XFER_TRANSPORT_TCP;
    cfg.sockets_per_peer = socks;
    cfg.progress_threads = threads;
    cfg.node_id = me;
    int rc;
    if (!(*e = xfer_engine_new(&cfg, &rc)))
        return -1;
    struct xfer_peer_desc mine, theirs;
    xfer_engine_describe(*e, &mine);
    if (write(wfd, &mine, sizeof(mine)) != (ssize_t)sizeof(mine) ||
        read(rfd, &theirs, sizeof(theirs)) != (ssize_t)sizeof(theirs))
        return -1;
    if (xfer_peer_add(*e, &theirs, p) != 0 || xfer_peer_connect(*p) != 0)
        return -1;
    return 0;
}

/* fp_side_up_n with 2 sockets per peer and 2 progress threads. */
static inline int fp_side_up(xfer_engine **e, xfer_peer **p, const char *me, int rfd, int wfd)
{
    return fp_side_up_n(e, p, me, rfd, wfd, 2, 2);
}

/* Forks the other side: child(rfd, wfd, arg) runs there, its return the
 * exit status; *rfd, *wfd: this side's ends. The pid, or -1. */
static inline pid_t fp_fork(int (*child)(int rfd, int wfd, void *arg), void *arg, int *rfd,
                            int *wfd)
{
    int ab[2], ba[2];
    if (pipe(ab) != 0 || pipe(ba) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(ab[1]);
        close(ba[0]);
        _exit(child(ab[0], ba[1], arg));
    }
    close(ab[0]);
    close(ba[1]);
    *rfd = ba[0];
    *wfd = ab[1];
    return pid;
}

/* fp_fork, then this side's engine `me` up (fp_side_up); with long_form
 * it is created with XFER_MSG_SHORT=0 (the long RTS forms; the child,
 * forked already, sends the short ones). The pid, or -1. */
static inline pid_t fp_fork_up(int (*child)(int rfd, int wfd, void *arg), void *arg, const char *me,
                               bool long_form, xfer_engine **e, xfer_peer **p, int *rfd, int *wfd)
{
    pid_t pid = fp_fork(child, arg, rfd, wfd);
    if (pid <= 0)
        return -1;
    if (long_form) /* read at engine creation */
        setenv("XFER_MSG_SHORT", "0", 1);
    int rc = fp_side_up(e, p, me, *rfd, *wfd);
    unsetenv("XFER_MSG_SHORT");
    return rc == 0 ? pid : -1;
}

/* Message bytes of pattern seed (test_send_local, test_tcp_back). */
static inline void fp_fill(uint8_t *p, uint32_t n, uint32_t seed)
{
    for (uint32_t i = 0; i < n; i++)
        p[i] = (uint8_t)(seed * 131 + i * 7 + 1);
}

static inline bool fp_same(const uint8_t *p, uint32_t n, uint32_t seed)
{
    for (uint32_t i = 0; i < n; i++)
        if (p[i] != (uint8_t)(seed * 131 + i * 7 + 1))
            return false;
    return true;
}

/* Receives a message with tag into r at 64 KiB (waiting at most
 * deadline_ms): NULL, or why it is not the n bytes of pattern seed. */
static inline const char *fp_recv_check(xfer_engine *e, xfer_region *r, xfer_peer *p, uint64_t tag,
                                        uint32_t n, uint32_t seed, int deadline_ms)
{
    uint64_t got = 0;
    uint8_t *at = (uint8_t *)xfer_region_ptr(r) + 65536;
    memset(at, 0, n);
    if (xfer_recv(e, r, 65536, 65536, p, tag, &got, deadline_ms) != 0)
        return "recv failed";
    return got == n && fp_same(at, n, seed) ? NULL : "wrong message";
}

/* Tells the child this side is done (its rfd ends), waits for it: its
 * exit status, or -1. */
static inline int fp_join(pid_t pid, int rfd, int wfd)
{
    close(wfd);
    int st = 0;
    pid_t w = waitpid(pid, &st, 0);
    close(rfd);
    return w == pid && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#endif
