/*
 * Waiting for a batch: poll, and wait with its optional busy-poll and
 * waiter-driven receive (the waiting thread reads its run's channel itself,
 * woken through a per-thread eventfd when another thread finishes the run).
 */
#include "batch.h"
#include "thread_exit.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

__thread const xfer_batch *batch_polling; /* batch.h */

/* ---- waiting ---------------------------------------------------------------- */

int xfer_batch_poll(xfer_batch *b)
{
    if (!b)
        return -XFER_EINVAL;
    pthread_mutex_lock(&b->mu);
    int rc = b->state == B_RUNNING ? -XFER_EINPROGRESS
             : b->state == B_DONE  ? b->result
                                   : -XFER_EINVAL;
    pthread_mutex_unlock(&b->mu);
    return rc;
}

void xfer_batch_wait_hint(xfer_batch *b, struct xfer_conn *c, void *chan)
{
    pthread_mutex_lock(&b->mu);
    if (b->wait_conn && (b->wait_conn != c || b->wait_chan != chan))
        b->wait_many = true;
    b->wait_peer = c->peer; /* c is valid here: post runs under the peer's conn_lock */
    b->wait_conn = c;
    b->wait_chan = chan;
    pthread_mutex_unlock(&b->mu);
}

int xfer_batch_wake_fd(const xfer_batch *b)
{
    return b->wake_fd;
}

/* Each thread that waits with waiter-driven receive has one eventfd for
 * "your batch ended" (made on its first such wait, closed when the thread
 * exits): an eventfd per batch cost eventfd2 + close per one-item batch,
 * i.e. per xfer_send/xfer_recv. */
static __thread int waker = -1;

/* At the thread's exit (thread_exit.h; not after the library was unloaded:
 * then its eventfd stays open). */
static void waker_close(void)
{
    if (waker >= 0)
        close(waker);
    waker = -1;
}

static int waker_fd(void)
{
    if (waker < 0) {
        waker = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (waker >= 0 && !xfer_thread_exit_arm(XFER_EXIT_WAKER, waker_close))
            xfer_debug("batch: no thread-exit hook for a waiter eventfd (it stays open)");
    }
    return waker;
}

bool xfer_batch_running(const xfer_batch *b)
{
    return __atomic_load_n(&b->state, __ATOMIC_ACQUIRE) == B_RUNNING;
}

/* Slices of a waiter-driven receive: the peer's connection lock is held
 * for reading meanwhile, so a disconnect waits at most this long. */
#define WAIT_RX_SLICE_MS 20

/* The waiting thread receives on the run's one channel itself (see
 * xfer_batch_wait_hint), and on what the peer of its two-sided items sends
 * (msg_peer: an RTS for its RECV, the FIN of its SEND arrive there), until
 * the run ends, end_ns passes, or the transport cannot; then the usual
 * sleep on cv takes over. XFER_WAIT_RX=0 turns it off. */
/* XFER_WAIT_RX=0: no waiter-driven receive; XFER_WAIT_RX_IN=0: not the
 * peer's messages (docs/perf.md, "Message waiters read their peer's
 * socket"). */
static int rx_off = -1, rx_in_on = -1;

static void rx_env(void)
{
    if (__atomic_load_n(&rx_off, __ATOMIC_RELAXED) < 0) {
        __atomic_store_n(&rx_in_on, !xfer_env_off("XFER_WAIT_RX_IN"), __ATOMIC_RELAXED);
        __atomic_store_n(&rx_off, xfer_env_off("XFER_WAIT_RX"), __ATOMIC_RELAXED);
    }
}

/* b->mu held on entry and on return; let go around each transport wait.
 * (One lock per slice, taken over from the caller and handed back: it took
 * two more per message, docs/notify.md "Per-message locks".) */
static void wait_rx(xfer_batch *b, int64_t end_ns, int64_t now_ns)
{
    rx_env();
    if (__atomic_load_n(&rx_off, __ATOMIC_RELAXED))
        return;
    for (bool first = true;; first = false) {
        bool run = b->state == B_RUNNING;
        struct xfer_conn *c = run && !b->wait_many ? b->wait_conn : NULL;
        void *chan = c ? b->wait_chan : NULL;
        xfer_peer *p = c ? b->wait_peer : NULL;
        bool in = run && b->msg_peer && !b->msg_many && (!p || p == b->msg_peer) &&
                  __atomic_load_n(&rx_in_on, __ATOMIC_RELAXED) == 1;
        if (in)
            p = b->msg_peer;
        b->wake_fd = p ? waker_fd() : -1;
        if (b->wake_fd < 0) /* the end of the run wakes the poll through it */
            p = NULL;
        b->wait_polling = p != NULL;
        int64_t left_ms = p ? (end_ns - (first ? now_ns : xfer_mono_ns())) / 1000000 : 0;
        if (!p || left_ms <= 0) {
            b->wait_polling = false;
            return;
        }
        pthread_mutex_unlock(&b->mu);
        int rc = -1;
        pthread_rwlock_rdlock(&p->conn_lock); /* c is only used if still p's */
        struct xfer_conn *pc = p->conn;
        if (pc && (!c || pc == c) && pc->transport->ops->wait_rx) {
            const xfer_batch *outer = batch_polling; /* a waiter may serve other batches */
            batch_polling = b;
            rc = pc->transport->ops->wait_rx(
                pc, chan, in, b, left_ms < WAIT_RX_SLICE_MS ? (int)left_ms : WAIT_RX_SLICE_MS);
            batch_polling = outer;
        }
        pthread_rwlock_unlock(&p->conn_lock);
        pthread_mutex_lock(&b->mu);
        b->wait_polling = false;
        bool hit = b->wake_hit;
        b->wake_hit = false;
        if (hit) { /* (rare: the run ended on another thread while we polled) */
            pthread_mutex_unlock(&b->mu);
            uint64_t drain;
            if (read(waker, &drain, sizeof(drain)) < 0 && errno != EAGAIN)
                xfer_debug("waiter eventfd drain failed");
            pthread_mutex_lock(&b->mu);
        }
        if (rc < 0)
            return;
    }
}

/* Optional bounded busy-poll (cfg.busy_poll_us) before the sleep. */
static void spin_while_running(xfer_batch *b, int timeout_ms)
{
    int64_t us = b->engine->cfg.busy_poll_us;
    if (us <= 0 || timeout_ms == 0)
        return;
    if (timeout_ms > 0 && us > (int64_t)timeout_ms * 1000)
        us = (int64_t)timeout_ms * 1000;
    int64_t end = xfer_mono_ns() + us * 1000;
    for (unsigned k = 1; __atomic_load_n(&b->state, __ATOMIC_ACQUIRE) == B_RUNNING; k++) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ volatile("yield");
#endif
        if (k % 64 == 0 && xfer_mono_ns() >= end)
            return;
    }
}

/* Does the transport of b's message peer (or of the one channel its
 * items wait on, xfer_batch_wait_hint) busy-poll in wait_rx itself
 * (XFER_CAP_RX_SPIN)? Then the waiter spins there, on that channel, and
 * reads what arrives: no thread is woken at all. */
static bool rx_spins(xfer_batch *b)
{
    if (b->engine->cfg.busy_poll_us <= 0)
        return false;
    rx_env();
    if (__atomic_load_n(&rx_off, __ATOMIC_RELAXED))
        return false;
    bool in_on = __atomic_load_n(&rx_in_on, __ATOMIC_RELAXED) == 1;
    pthread_mutex_lock(&b->mu);
    xfer_peer *p = NULL;
    if (b->state == B_RUNNING && b->msg_peer)
        p = in_on && !b->msg_many ? b->msg_peer : NULL;
    else if (b->state == B_RUNNING && b->wait_conn && !b->wait_many)
        p = b->wait_peer;
    pthread_mutex_unlock(&b->mu);
    if (!p)
        return false;
    pthread_rwlock_rdlock(&p->conn_lock);
    bool spins = p->conn && (p->conn->transport->ops->caps & XFER_CAP_RX_SPIN);
    pthread_rwlock_unlock(&p->conn_lock);
    return spins;
}

/* io_timeout_ms bounds what a transport still does after a deadline. */
static int64_t after_deadline_ns(const xfer_batch *b)
{
    return ((int64_t)b->engine->cfg.io_timeout_ms + 2000) * 1000000;
}

/* b->mu held: sleeps on cv while b runs, until ts. A waited run (not on the
 * monitor's list: batch_submit_wait) with no timeout of its own is ended
 * here at its deadline, as the monitor would, and then waited for as the
 * monitor's runs are. */
static void sleep_while_running(xfer_batch *b, struct timespec ts, bool expire)
{
    for (;;) {
        while (b->state == B_RUNNING)
            if (batch_cv_wait(b, &ts) == ETIMEDOUT)
                break;
        if (b->state != B_RUNNING || !expire)
            return;
        expire = false;
        pthread_mutex_unlock(&b->mu);
        batch_expire(b);
        pthread_mutex_lock(&b->mu);
        ts = xfer_mono_after_ns(after_deadline_ns(b));
    }
}

/* xfer_batch_wait with the clock already read (now_ns, or 0: read here). */
static int wait_at(xfer_batch *b, int timeout_ms, int64_t now_ns)
{
    /* Ended already (a locally completed SEND, a RECV matched at submit):
     * finish_quiet stores DONE after the result, nothing writes the result
     * while DONE but the owner's next submit: no lock (two per message). */
    if (__atomic_load_n(&b->state, __ATOMIC_ACQUIRE) == B_DONE)
        return b->result;
    if (!rx_spins(b))
        spin_while_running(b, timeout_ms);
    pthread_mutex_lock(&b->mu);
    /* One clock read for the limit, the receive's end and its first slice
     * (there were four per wait of a one-item WRITE), none for the sleep
     * unless it is needed. */
    int64_t limit_ns, now = now_ns ? now_ns : xfer_mono_ns();
    bool expire = b->waited && timeout_ms < 0; /* this thread is its deadline monitor */
    if (timeout_ms >= 0)
        limit_ns = (int64_t)timeout_ms * 1000000;
    else if (expire)
        limit_ns = b->deadline_ns - now;
    else /* the monitor ends it at the deadline; io_timeout bounds the rest */
        limit_ns = b->deadline_ns - now + after_deadline_ns(b);
    if (limit_ns < 0)
        limit_ns = 0;
    bool rx = (b->wait_conn && !b->wait_many) || (b->msg_peer && !b->msg_many);
    if (b->state == B_RUNNING && rx && timeout_ms != 0) {
        /* The run ends at its deadline: stop receiving there, the sleep
         * below then sees the end (or makes it, for a waited run). */
        int64_t end = now + limit_ns;
        if (end > b->deadline_ns)
            end = b->deadline_ns;
        wait_rx(b, end, now);
    }
    if (b->state == B_RUNNING) /* until the same end: the receive's time counts */
        sleep_while_running(b, xfer_mono_at_ns(now + limit_ns), expire);
    int rc = b->state == B_RUNNING ? -XFER_EINPROGRESS
             : b->state == B_DONE  ? b->result
                                   : -XFER_EINVAL;
    pthread_mutex_unlock(&b->mu);
    return rc;
}

int xfer_batch_wait(xfer_batch *b, int timeout_ms)
{
    return b ? wait_at(b, timeout_ms, 0) : -XFER_EINVAL;
}

int batch_wait_submitted(xfer_batch *b)
{
    /* The submit read the clock microseconds ago (t_submit_ns, set before
     * the posts): the limit counts from there, a clock read less per call. */
    return wait_at(b, -1, b->t_submit_ns);
}
