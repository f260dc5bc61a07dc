/* TCP transport: ops table, listener and acceptor, progress threads. */
#include "tcp.h"
#include "xfer_io.h"
#include "handshake.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int tcp_probe(xfer_engine *e, char *why, size_t why_len)
{
    (void)e;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(why, why_len, "socket(): %s", strerror(errno));
        return -XFER_ENOTSUP;
    }
    close(fd);
    return 0;
}

static bool tcp_reaches(struct xfer_transport *t, const struct xfer_peer_desc *peer)
{
    (void)t;
    return (peer->transports & XFER_TRANSPORT_TCP) && peer->addr[0] && peer->data_port;
}

void tcp_sock_tune(struct tcp_transport *tt, int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (tt->sockbuf > 0) {
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &tt->sockbuf, sizeof(tt->sockbuf));
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &tt->sockbuf, sizeof(tt->sockbuf));
    }
}

bool tcp_solo_setup(int fd)
{
    struct timeval tv = {0, TCP_SOLO_MS * 1000};
    int fl = fcntl(fd, F_GETFL);
    return fl >= 0 && setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0 &&
           fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == 0;
}

/* ---- progress threads ------------------------------------------------------ */

void tcp_thread_adopt(struct tcp_transport *tt, struct tcp_sock *s)
{
    unsigned k = __atomic_fetch_add(&tt->next_thread, 1, __ATOMIC_RELAXED);
    struct tcp_thread *th = &tt->threads[k % (unsigned)tt->n_threads];
    __atomic_store_n(&s->th, th, __ATOMIC_RELEASE); /* tcp_back.c looks unlocked */
    pthread_mutex_lock(&th->mu);
    s->th_prev = NULL;
    s->th_next = th->socks;
    if (th->socks)
        th->socks->th_prev = s;
    th->socks = s;
    s->ev_mask = EPOLLIN | EPOLLRDHUP | EPOLLET; /* EPOLLOUT once a send finds it full */
    struct epoll_event ev = {.events = s->ev_mask, .data.ptr = s};
    if (epoll_ctl(th->epfd, EPOLL_CTL_ADD, s->fd, &ev) < 0)
        xfer_err("tcp: epoll_ctl add %s: %s", s->name, strerror(errno));
    pthread_mutex_unlock(&th->mu);
}

void tcp_sock_interest(struct tcp_sock *s)
{
    uint32_t m = EPOLLRDHUP | EPOLLET;
    if (!__atomic_load_n(&s->waiters, __ATOMIC_SEQ_CST) && !s->rx_lazy)
        m |= EPOLLIN;
    if (s->out_armed)
        m |= EPOLLOUT;
    if (m == s->ev_mask || s->fd < 0)
        return;
    /* Re-adding a condition that holds (data there, room to send) reports
     * it at once: nothing that happened meanwhile is missed. */
    struct epoll_event ev = {.events = m, .data.ptr = s};
    if (epoll_ctl(s->th->epfd, EPOLL_CTL_MOD, s->fd, &ev) == 0)
        s->ev_mask = m;
    else
        xfer_err("tcp: epoll_ctl mod %s: %s", s->name, strerror(errno));
}

static void wake(int fd)
{
    uint64_t one = 1;
    if (write(fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        xfer_err("tcp: eventfd write: %s", strerror(errno));
}

void tcp_thread_wake(struct tcp_thread *th)
{
    wake(th->wakefd);
}

void tcp_thread_kick(struct tcp_sock *s)
{
    struct tcp_thread *th = s->th;
    pthread_mutex_lock(&th->mu);
    bool first = !th->kick_head;
    if (!s->kicked) {
        s->kicked = true;
        s->kick_next = th->kick_head;
        __atomic_store_n(&th->kick_head, s, __ATOMIC_RELEASE); /* serve_kicks peeks */
    }
    pthread_mutex_unlock(&th->mu);
    if (first)
        wake(th->wakefd);
}

/* Sends what posters queued; closes sockets disconnect asked for. A socket
 * stays marked kicked until its turn, so a concurrent kick cannot relink it
 * (and so redirect this walk) while it still waits in the detached list. */
static void serve_kicks(struct tcp_thread *th)
{
    /* No lock round when nothing is queued (most turns of the loop): a kick
     * that is pushed after this look writes wakefd after it, so the next
     * epoll_wait returns and the next turn serves it. */
    if (!__atomic_load_n(&th->kick_head, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&th->mu);
    struct tcp_sock *s = th->kick_head;
    __atomic_store_n(&th->kick_head, NULL, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&th->mu);
    bool released = false;
    while (s) {
        pthread_mutex_lock(&th->mu);
        struct tcp_sock *next = s->kick_next;
        s->kicked = false;
        /* Released already (closed on the way, e.g. its peer went away
         * after disconnect asked): disconnect frees it once it is off this
         * list, so not one more look at it. */
        bool gone = s->released;
        s->closing = s->close_req;
        pthread_mutex_unlock(&th->mu);
        if (gone) {
            released = true; /* (the broadcast below tells disconnect) */
        } else if (s->closing) {
            /* No iomu: disconnect holds the peer's connection lock for
             * writing, so no submitter is on s, and it frees s as soon as
             * released is set. */
            tcp_sock_fail(s, -XFER_ECONN, "disconnected");
            released = true;
        } else if (s->fd >= 0) {
            pthread_mutex_lock(&s->iomu);
            tcp_sock_deferred(s);
            if (s->fd >= 0)
                tcp_sock_writable(s);
            tcp_sock_attend(s);
            pthread_mutex_unlock(&s->iomu);
        }
        s = next;
    }
    if (released) {
        pthread_mutex_lock(&th->mu);
        pthread_cond_broadcast(&th->cv);
        pthread_mutex_unlock(&th->mu);
    }
}

static void serve_ready(struct tcp_thread *th)
{
    struct tcp_sock *s = th->ready_head;
    th->ready_head = NULL;
    while (s) {
        struct tcp_sock *next = s->ready_next;
        s->in_ready = false;
        pthread_mutex_lock(&s->iomu);
        if (s->fd >= 0)
            tcp_sock_readable(s);
        tcp_sock_attend(s);
        pthread_mutex_unlock(&s->iomu);
        s = next;
    }
}

static void check_timeouts(struct tcp_thread *th)
{
    int64_t now = xfer_now_ms();
    pthread_mutex_lock(&th->mu);
    struct tcp_sock *s = th->socks;
    pthread_mutex_unlock(&th->mu);
    /* Only this thread unlinks its sockets, so walking without mu is safe;
     * a concurrently adopted one is simply checked next time. */
    while (s) {
        struct tcp_sock *next = s->th_next;
        pthread_mutex_lock(&s->iomu);
        tcp_sock_check_timeout(s, now);
        pthread_mutex_unlock(&s->iomu);
        s = next;
    }
}

/* epoll_wait for at most ns (the fine tick is below epoll_wait's 1 ms);
 * a kernel without epoll_pwait2 (before 5.11) gets whole milliseconds. */
static int sleep_epoll(int epfd, struct epoll_event *ev, int64_t ns)
{
#ifdef __SANITIZE_THREAD__
    /* ThreadSanitizer (gcc 12) does not intercept epoll_pwait2, so it would
     * miss the ordering epoll gives a socket added by another thread and
     * report every access to it as a race: whole milliseconds there. */
    static bool no_pwait2 = true;
#else
    static bool no_pwait2;
#endif
    if (!__atomic_load_n(&no_pwait2, __ATOMIC_RELAXED)) {
        struct timespec ts = {ns / 1000000000, ns % 1000000000};
        int n = epoll_pwait2(epfd, ev, 64, &ts, NULL);
        if (n >= 0 || errno != ENOSYS)
            return n;
        __atomic_store_n(&no_pwait2, true, __ATOMIC_RELAXED);
    }
    return epoll_wait(epfd, ev, 64, (int)((ns + 999999) / 1000000));
}

/* CLOCK_MONOTONIC as of the last tick (a few ms behind at most). */
static int64_t mono_coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Should th tick fine: lazy accepted sockets (tcp_wait.c), or answers
 * held for a next frame (tcp_back.c)? */
static bool wants_fine(struct tcp_thread *th)
{
    return __atomic_load_n(&th->lazy_tgt, __ATOMIC_SEQ_CST) > 0 ||
           __atomic_load_n(&th->held_n, __ATOMIC_SEQ_CST) > 0;
}

static void *thread_main(void *arg)
{
    tcp_send_thread_init();
    struct tcp_thread *th = arg;
    struct tcp_transport *tt = th->tt;
    struct epoll_event ev[64];
    int64_t next_check = xfer_now_ms() + 100, next_tick = 0;
    while (!__atomic_load_n(&tt->stop, __ATOMIC_ACQUIRE)) {
        /* A waiter that puts a socket on the lazy list wakes us unless it
         * sees us ticking (tcp_wait.c): we say whether we tick, then look
         * at the list again, so one of the two sees the other (seq_cst). */
        bool ticking = __atomic_load_n(&th->lazy_head, __ATOMIC_SEQ_CST) != NULL;
        __atomic_store_n(&th->ticking, ticking, __ATOMIC_SEQ_CST);
        if (!ticking)
            ticking = __atomic_load_n(&th->lazy_head, __ATOMIC_SEQ_CST) != NULL;
        /* The same for the fine tick, with lazy_tgt (tcp_wait.c). */
        bool fine = wants_fine(th);
        __atomic_store_n(&th->tick_fine, fine, __ATOMIC_SEQ_CST);
        if (!fine)
            fine = wants_fine(th);
        ticking |= fine;
        int64_t tick_ns = fine ? TCP_LAZY_TICK_TGT_US * 1000 : TCP_LAZY_TICK_MS * 1000000;
        int64_t sleep_ns = th->ready_head || th->gpu_head ? 0 : ticking ? tick_ns : 100 * 1000000;
        int n = sleep_epoll(th->epfd, ev, sleep_ns);
        for (int i = 0; i < n; i++) {
            struct tcp_sock *s = ev[i].data.ptr;
            if (!s) {
                uint64_t v;
                if (read(th->wakefd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                    xfer_err("tcp: eventfd read: %s", strerror(errno));
                continue;
            }
            pthread_mutex_lock(&s->iomu);
            /* A waiter polling s reads it (tcp_wait.c), and once more after
             * it stopped polling if skipped: this edge is not lost. */
            if (s->fd >= 0 && (ev[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP))) {
                if (!__atomic_load_n(&s->waiters, __ATOMIC_SEQ_CST)) {
                    /* it came while nobody waited (tcp_wait.c) */
                    s->lazy_clean = 0;
                    if (__atomic_exchange_n(&s->lazy_gave, false, __ATOMIC_RELAXED))
                        __atomic_store_n(&s->lazy_off_ms, xfer_now_ms() + TCP_LAZY_OFF_MS,
                                         __ATOMIC_RELAXED);
                    tcp_sock_readable(s);
                } else
                    s->skipped = true;
            }
            if (s->fd >= 0 && (ev[i].events & EPOLLOUT)) {
                tcp_sock_writable(s);
                if (s->fd >= 0 && s->out_armed && !s->tx_head) { /* drained: no more edges */
                    s->out_armed = false;
                    tcp_sock_interest(s);
                }
            }
            tcp_sock_attend(s);
            pthread_mutex_unlock(&s->iomu);
        }
        serve_kicks(th);
        serve_ready(th);
        if (th->gpu_head)
            tcp_gpu_pump(th);
        /* The fine clock only while ticking: the 100 ms check is served by
         * the coarse one (~5 ns against ~20 ns a read; a turn per request). */
        int64_t now_ns = ticking ? xfer_mono_ns() : mono_coarse_ns(), now = now_ns / 1000000;
        if (next_tick - now_ns > tick_ns)
            next_tick = now_ns + tick_ns; /* the tick turned fine */
        if (ticking && now_ns >= next_tick) {
            if (__atomic_load_n(&th->held_n, __ATOMIC_RELAXED))
                tcp_held_tick(th);
            tcp_lazy_tick(th);
            next_tick = now_ns + tick_ns;
        }
        if (now >= next_check) {
            check_timeouts(th);
            next_check = now + 100;
        }
        tcp_reap(th, false);
    }
    return NULL;
}

static int thread_start(struct tcp_transport *tt, struct tcp_thread *th)
{
    th->tt = tt;
    pthread_mutex_init(&th->mu, NULL);
    xfer_cond_init_mono(&th->cv);
    th->epfd = epoll_create1(EPOLL_CLOEXEC);
    th->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (th->epfd < 0 || th->wakefd < 0)
        return -XFER_EIO;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(th->epfd, EPOLL_CTL_ADD, th->wakefd, &ev) < 0)
        return -XFER_EIO;
    if (pthread_create(&th->thread, NULL, thread_main, th) != 0)
        return -XFER_ENOMEM;
    return 0;
}

/* ---- listener ---------------------------------------------------------------- */

static int listen_on(struct tcp_transport *tt, const char *addr, uint16_t port)
{
    char why[160];
    uint16_t bound;
    int rc = xfer_listen_tcp(addr, port, 256, false, &tt->listen_fd, &bound, why, sizeof(why));
    if (rc < 0) {
        xfer_engine_set_error(tt->engine, "tcp: %s", why);
        return rc;
    }
    xfer_engine_set_data_port(tt->engine, bound);
    return 0;
}

static void addr_text(const struct sockaddr_storage *ss, char *out, size_t len)
{
    char host[64] = "?";
    uint16_t port = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
        port = ntohs(a->sin_port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
        port = ntohs(a->sin6_port);
    }
    snprintf(out, len, "%s:%u", host, port);
}

/* Handshake of one accepted socket; on success it joins a progress thread. */
static void accept_one(struct tcp_transport *tt, int fd, const char *from)
{
    xfer_engine *e = tt->engine;
    const struct xfer_engine_config *cfg = xfer_engine_config_get(e);
    struct xfer_hs_self hs = {cfg->node_id, xfer_engine_incarnation(e), cfg->secret,
                              cfg->secret_len, 0};
    struct xfer_hs_peer hp;
    char why[200] = "";
    int rc = xfer_handshake_server(fd, &hs, cfg->connect_timeout_ms, &hp, why, sizeof(why));
    if (rc < 0) {
        xfer_warn("tcp: refused connection from %s: %s (%s)", from, why, xfer_strerror(rc));
        close(fd);
        return;
    }
    char name[96];
    snprintf(name, sizeof(name), "%.40s@%.50s", hp.node_id, from);
    tcp_sock_tune(tt, fd);
    struct tcp_sock *s = tcp_sock_new(tt, fd, true, name);
    if (!s) {
        close(fd);
        return;
    }
    snprintf(s->peer_node, sizeof(s->peer_node), "%s", hp.node_id);
    s->peer_hash = tcp_peer_hash(s->peer_node);
    s->peer_inc = hp.incarnation;
    s->back_out = tt->back && (hp.purpose & TCP_PURPOSE_BACK); /* (tcp_back.c) */
    s->solo_ok = tt->solo && tcp_solo_setup(fd);
    xfer_debug("tcp: serving %s (socket %u%s)", name, hp.purpose & TCP_PURPOSE_INDEX,
               s->back_out ? ", takes messages back" : "");
    tcp_back_note(s); /* before its owner may close it (and reap it) */
    tcp_thread_adopt(tt, s);
}

/* Each handshake runs in its own short-lived thread, so a peer that
 * connects and then says nothing delays no one else. */
struct hs_job {
    struct tcp_transport *tt;
    int fd;
    char from[80];
};

static void *handshake_main(void *arg)
{
    struct hs_job *job = arg;
    struct tcp_transport *tt = job->tt;
    accept_one(tt, job->fd, job->from);
    free(job);
    pthread_mutex_lock(&tt->hs_mu);
    tt->hs_running--;
    pthread_cond_broadcast(&tt->hs_cv);
    pthread_mutex_unlock(&tt->hs_mu);
    return NULL;
}

static void start_handshake(struct tcp_transport *tt, int fd, const char *from)
{
    struct hs_job *job = malloc(sizeof(*job));
    pthread_mutex_lock(&tt->hs_mu);
    bool room = job && tt->hs_running < TCP_HANDSHAKES_MAX;
    if (room)
        tt->hs_running++;
    pthread_mutex_unlock(&tt->hs_mu);
    if (!room) {
        xfer_warn("tcp: refused connection from %s: too many handshakes in progress", from);
        free(job);
        close(fd);
        return;
    }
    *job = (struct hs_job){tt, fd, ""};
    snprintf(job->from, sizeof(job->from), "%s", from);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    if (pthread_create(&t, &attr, handshake_main, job) != 0) {
        xfer_warn("tcp: refused connection from %s: cannot start a thread", from);
        free(job);
        close(fd);
        pthread_mutex_lock(&tt->hs_mu);
        tt->hs_running--;
        pthread_mutex_unlock(&tt->hs_mu);
    }
    pthread_attr_destroy(&attr);
}

/* Handshakes are bounded by connect_timeout_ms; wait that long at most. */
static void wait_handshakes(struct tcp_transport *tt)
{
    int ms = xfer_engine_config_get(tt->engine)->connect_timeout_ms + 2000;
    struct timespec ts = xfer_mono_after_ms(ms);
    pthread_mutex_lock(&tt->hs_mu);
    while (tt->hs_running > 0)
        if (pthread_cond_timedwait(&tt->hs_cv, &tt->hs_mu, &ts) == ETIMEDOUT)
            break;
    if (tt->hs_running > 0)
        xfer_err("tcp: %d handshakes still running at close", tt->hs_running);
    pthread_mutex_unlock(&tt->hs_mu);
}

static void *acceptor_main(void *arg)
{
    struct tcp_transport *tt = arg;
    struct pollfd pfd[2] = {{tt->listen_fd, POLLIN, 0}, {tt->accept_wakefd, POLLIN, 0}};
    while (!__atomic_load_n(&tt->stop, __ATOMIC_ACQUIRE)) {
        if (poll(pfd, 2, 1000) <= 0 || __atomic_load_n(&tt->stop, __ATOMIC_ACQUIRE) ||
            !(pfd[0].revents & POLLIN))
            continue;
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int fd = accept4(tt->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                xfer_warn("tcp: accept: %s", strerror(errno));
            continue;
        }
        char from[80];
        addr_text(&ss, from, sizeof(from));
        start_handshake(tt, fd, from);
    }
    return NULL;
}

/* ---- open / close -------------------------------------------------------------- */

static void tcp_close(struct xfer_transport *t)
{
    struct tcp_transport *tt = container_of(t, struct tcp_transport, base);
    __atomic_store_n(&tt->stop, true, __ATOMIC_RELEASE); /* read by every thread, unlocked */
    if (tt->acceptor_started) {
        wake(tt->accept_wakefd);
        pthread_join(tt->acceptor, NULL);
    }
    wait_handshakes(tt); /* they hand sockets to the progress threads */
    for (int i = 0; i < tt->n_threads; i++) {
        struct tcp_thread *th = &tt->threads[i];
        if (th->thread) {
            wake(th->wakefd);
            pthread_join(th->thread, NULL);
        }
        while (th->socks) { /* target sockets; initiators left with their peers */
            struct tcp_sock *s = th->socks;
            tcp_sock_fail_as(s, XFER_LOG_DEBUG, "transport closing");
            tcp_reap(th, true);
            if (th->socks == s) { /* an initiator socket nobody released */
                th->socks = s->th_next;
            }
        }
        tcp_gpu_thread_free(th);
        if (th->epfd >= 0)
            close(th->epfd);
        if (th->wakefd >= 0)
            close(th->wakefd);
        pthread_cond_destroy(&th->cv);
        pthread_mutex_destroy(&th->mu);
        pthread_mutex_destroy(&th->fence_mu);
    }
    if (tt->listen_fd >= 0)
        close(tt->listen_fd);
    if (tt->accept_wakefd >= 0)
        close(tt->accept_wakefd);
    free(tt->threads);
    tcp_slab_free(tt->spare); /* every chunk was freed with its socket above */
    pthread_cond_destroy(&tt->hs_cv);
    pthread_mutex_destroy(&tt->hs_mu);
    pthread_mutex_destroy(&tt->in_mu);
    tcp_fence_fini(tt);
    free(tt);
}

static int tcp_open(xfer_engine *e, struct xfer_transport **out)
{
    const struct xfer_engine_config *cfg = xfer_engine_config_get(e);
    struct tcp_transport *tt = calloc(1, sizeof(*tt));
    if (!tt)
        return -XFER_ENOMEM;
    tt->base.ops = &xfer_tcp_transport_ops;
    tt->base.engine = e;
    tt->engine = e;
    tt->listen_fd = -1;
    pthread_mutex_init(&tt->hs_mu, NULL);
    pthread_mutex_init(&tt->in_mu, NULL);
    xfer_cond_init_mono(&tt->hs_cv);
    tcp_fence_init(tt);
    const char *sb = getenv("XFER_TCP_SOCKBUF");
    tt->sockbuf = sb ? atoi(sb) : 0;
    tt->direct = !xfer_env_off("XFER_TCP_DIRECT"); /* off: always hand off (measuring) */
    tt->solo = !xfer_env_off("XFER_TCP_SOLO");     /* off: waiters always poll (measuring) */
    tt->lazy_target = !xfer_env_off("XFER_TCP_LAZY_TARGET");
    tt->one_reader = !xfer_env_off("XFER_TCP_ONE_READER");
    tt->lazy_clean = xfer_env_off("XFER_TCP_LAZY_CLEAN") ? 0 : TCP_LAZY_CLEAN;
    tt->notif_ack = !xfer_env_off("XFER_NOTIF_WAIT_ACK");
    tt->back = !xfer_env_off("XFER_TCP_BACK");         /* off: own connections only */
    tt->sendfile = !xfer_env_off("XFER_TCP_SENDFILE"); /* off: payloads always copied */
    tt->hold = !xfer_env_off("XFER_TCP_HOLD");         /* off: answers go out at once */
    tt->fold = !xfer_env_off("XFER_TCP_FOLD");         /* off: FINs ride as frames */
    const char *win = getenv("XFER_TCP_HOLD_WINDOW_US");
    tt->hold_window_ns = (int64_t)(win && atoi(win) > 0 ? atoi(win) : TCP_HOLD_WINDOW_US) * 1000;
    tt->accept_wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    tt->n_threads = cfg->progress_threads > 0 ? cfg->progress_threads : 1;
    tt->threads = calloc((size_t)tt->n_threads, sizeof(*tt->threads));
    int rc = -XFER_ENOMEM;
    if (!tt->threads || tt->accept_wakefd < 0)
        goto fail;
    for (int i = 0; i < tt->n_threads; i++) {
        tt->threads[i].epfd = tt->threads[i].wakefd = -1;
        pthread_mutex_init(&tt->threads[i].fence_mu, NULL);
    }
    rc = listen_on(tt, cfg->listen_addr, cfg->data_port);
    if (rc < 0)
        goto fail;
    for (int i = 0; i < tt->n_threads; i++)
        if ((rc = thread_start(tt, &tt->threads[i])) < 0)
            goto fail;
    rc = -XFER_ENOMEM;
    if (pthread_create(&tt->acceptor, NULL, acceptor_main, tt) != 0)
        goto fail;
    tt->acceptor_started = true;
    *out = &tt->base;
    return 0;
fail:
    if (!tt->threads) {
        pthread_cond_destroy(&tt->hs_cv);
        pthread_mutex_destroy(&tt->hs_mu);
        pthread_mutex_destroy(&tt->in_mu);
        tcp_fence_fini(tt);
        free(tt);
        return rc;
    }
    tcp_close(&tt->base);
    return rc;
}

const struct xfer_transport_ops xfer_tcp_transport_ops = {
    .name = "tcp",
    .bit = XFER_TRANSPORT_TCP,
#if XFER_WITH_CUDA /* through pinned staging slots, tcp_gpu.c */
    .caps = XFER_CAP_HOST_MEM | XFER_CAP_CUDA_MEM | XFER_CAP_RX_SPIN,
#else
    .caps = XFER_CAP_HOST_MEM | XFER_CAP_RX_SPIN, /* wait_rx busy-polls (tcp_wait.c) */
#endif
    .preference = 100,
    .probe = tcp_probe,
    .open = tcp_open,
    .close = tcp_close,
    .reaches = tcp_reaches,
    .connect = tcp_connect,
    .disconnect = tcp_disconnect,
    .conn_state = tcp_conn_state,
    .post = tcp_post,
    .wait_rx = tcp_wait_rx,
    .notif_wait_rx = tcp_notif_wait_rx,
    .send_msg = tcp_send_msg,
    .fence = tcp_fence,
};
