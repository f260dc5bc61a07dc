/* The shared-memory message ring of ipc connections (engine/ipc/ipc_ring.c,
 * docs/ipc.md "Message ring").
 *
 * test_race: two processes share a ring. The child is the owner: it reads
 * frames, sometimes spinning (no bell wanted), sometimes asleep in poll on
 * a socketpair or on an eventfd after saying so (the bell protocol of
 * ipc_serve_rx.c: the serving thread's socket, a message waiter's eventfd), and
 * answers each one. The parent is the initiator: one thread writes frames
 * of random lengths (wrapping the ring, filling it) with random pauses and
 * rings the bell only when ipc_ring_need_bell says so; another reads the
 * answers, spinning or asleep on the futex. Every frame must arrive once,
 * in order, byte for byte, every answer in order, and no sleeper may wait
 * past its deadline (a lost wake-up fails the test instead of hanging it).
 *
 * test_scribble: a raw client sets up a ring with an engine's owner and
 * then breaks it (indices out of range, a bad record header, a forged read
 * index of the answers): the owner must close that connection, and keep
 * serving its real peer. test_fallback: an unsealed memfd is refused and
 * the socket keeps carrying messages; an owner or an initiator with
 * XFER_IPC_RING=0 still exchanges messages (over the socket).
 * test_spinning_waiter: a RECV whose waiter spins (XFER_BUSY_POLL_US) takes
 * frames from the ring that no bell announced, and a ring it finds corrupt
 * ends that connection only (the spinner leaves the socket to the serving
 * thread, so it must end it as the serving thread would).
 * test_sleeping_waiter: a RECV whose waiter sleeps is woken through the
 * ring's eventfd (the initiator is told so), and an initiator that takes
 * no eventfd still gets the socket bell. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ipc/ipc.h"
#include "ipc/ipc_ring.h"
#include "msg_wire.h"
#include "transport.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define FRAMES 30000
#else
#define FRAMES 200000
#endif
#define SLEEP_DEADLINE_MS 3000 /* no sleeper waits this long unless a wake-up was lost */
#define IO_TIMEOUT        400
#define DEADLINE          10000

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static uint32_t frame_len(uint32_t i)
{
    return (i * 2654435761u) % 3000; /* 0 .. 2999 bytes */
}

static void frame_fill(uint8_t *p, uint32_t i, uint32_t len)
{
    for (uint32_t k = 0; k < len; k++)
        p[k] = (uint8_t)(i * 31 + k);
}

/* Owner process: 0 when every frame came once, in order. It sleeps on the
 * bell socket (as the serving thread) or on the eventfd efd (as a message
 * waiter), at random. */
static int owner_main(int ring_fd, int bell, int efd)
{
    struct ipc_ring r;
    if (ipc_ring_attach(&r, ring_fd) != 0)
        return 10;
    static uint8_t buf[4096], want[4096];
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    uint32_t next = 0;
    bool spinning = false;
    while (next < FRAMES) {
        uint32_t len = 0;
        int got = ipc_ring_get(&r, buf, sizeof(buf), &len);
        if (got < 0)
            return 11;
        if (got == 1) {
            frame_fill(want, next, frame_len(next));
            if (len != frame_len(next) || memcmp(buf, want, len) != 0)
                return 12;
            while (ipc_ring_answer(&r, (int32_t)(next & 0x7fffffff)) == -XFER_EBUSY)
                ;
            next++;
            continue;
        }
        if (rnd(&seed) % 4 == 0) { /* spin a while: writers ring no bell */
            if (!spinning)
                ipc_ring_sleep(&r, IPC_SLEEP_SPIN);
            spinning = true;
            continue;
        }
        bool on_efd = rnd(&seed) % 2;
        ipc_ring_sleep(&r, on_efd ? IPC_SLEEP_EFD : IPC_SLEEP_SOCK); /* then re-check */
        spinning = false;
        if (ipc_ring_pending(&r))
            continue;
        struct pollfd p = {.fd = on_efd ? efd : bell, .events = POLLIN};
        if (poll(&p, 1, SLEEP_DEADLINE_MS) != 1)
            return 13; /* a lost wake-up */
        uint64_t drain;
        if (on_efd) {
            if (read(efd, &drain, sizeof(drain)) != sizeof(drain))
                return 15;
            continue;
        }
        struct ipc_hdr h;
        if (ipc_recv(bell, &h, NULL, 0, NULL, 1000) != 0 || h.type != IPC_RING_BELL)
            return 14;
        ipc_ring_bell_taken(&r);
    }
    ipc_ring_unmap(&r);
    return 0;
}

struct initiator {
    struct ipc_ring r;
    int bell;
    int fails;
    unsigned bells, efd_bells; /* rung (socket, eventfd): the reader was asleep */
};

static void *writer_main(void *arg)
{
    struct initiator *in = arg;
    static uint8_t buf[4096];
    uint64_t seed = 12345;
    for (uint32_t i = 0; i < FRAMES; i++) {
        uint32_t len = frame_len(i);
        frame_fill(buf, i, len);
        int64_t end = now_ms() + SLEEP_DEADLINE_MS;
        int rc;
        while ((rc = ipc_ring_put(&in->r, buf, len)) == -XFER_EBUSY && now_ms() < end)
            ;
        if (rc != 0) {
            in->fails++;
            return NULL;
        }
        unsigned how = ipc_ring_need_bell(&in->r);
        in->bells += how == IPC_SLEEP_SOCK;
        in->efd_bells += how == IPC_SLEEP_EFD;
        if (ipc_ring_ring(&in->r, how, in->bell, 1000) != 0) {
            in->fails++;
            return NULL;
        }
        uint64_t x = rnd(&seed) % 64;
        if (x == 0) { /* a pause: the reader goes to sleep */
            struct timespec ts = {0, (long)(rnd(&seed) % 50000)};
            nanosleep(&ts, NULL);
        } else if (x == 1) {
            sched_yield();
        }
    }
    return NULL;
}

static void test_race(void **state)
{
    (void)state;
    struct initiator in = {0};
    int fd = -1, sv[2];
    assert_int_equal(ipc_ring_create(&in.r, &fd), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    in.r.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); /* the owner's, passed by fork */
    in.r.efd_up = in.r.efd >= 0;
    assert_true(in.r.efd_up);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        _exit(owner_main(fd, sv[1], in.r.efd));
    }
    close(sv[1]);
    close(fd);
    in.bell = sv[0];
    pthread_t w;
    pthread_create(&w, NULL, writer_main, &in);
    uint64_t seed = 777;
    for (uint32_t i = 0; i < FRAMES && !in.fails; i++) {
        int32_t st = 0;
        int64_t end = now_ms() + SLEEP_DEADLINE_MS;
        int got;
        while ((got = ipc_ring_take_answer(&in.r, &st)) == 0 && now_ms() < end)
            if (rnd(&seed) % 2)
                ipc_ring_wait_answer(&in.r, 1000 * SLEEP_DEADLINE_MS);
        assert_int_equal(got, 1); /* 0: a lost futex wake-up */
        assert_int_equal(st, (int32_t)(i & 0x7fffffff));
    }
    pthread_join(w, NULL);
    assert_int_equal(in.fails, 0);
    printf("%d frames, %u bells, %u eventfd writes\n", FRAMES, in.bells, in.efd_bells);
    /* it slept both ways, and it spun */
    assert_true(in.bells > 0 && in.efd_bells > 0 && in.bells + in.efd_bells < FRAMES);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    close(sv[0]);
    ipc_ring_unmap(&in.r);
}

/* ---- against an engine ------------------------------------------------ */

#include "ipc_fixture.h"

/* IPC_RING_REQ with ring_fd: the owner's status. */
static int32_t ring_req(int fd, int ring_fd)
{
    assert_int_equal(ipc_send(fd, IPC_RING_REQ, 0, NULL, 0, ring_fd, 1000), 0);
    struct ipc_hdr h;
    int32_t st = 1;
    assert_int_equal(ipc_recv(fd, &h, &st, sizeof(st), NULL, 2000), 0);
    assert_int_equal(h.type, IPC_RING_RESP);
    return st;
}

/* The same, keeping the waiters' eventfd the owner passes (r->efd). */
static int32_t ring_req_keep(int fd, int ring_fd, struct ipc_ring *r)
{
    assert_int_equal(ipc_send(fd, IPC_RING_REQ, 0, NULL, 0, ring_fd, 1000), 0);
    struct ipc_hdr h;
    int32_t st = 1;
    int efd = -1;
    assert_int_equal(ipc_recv(fd, &h, &st, sizeof(st), &efd, 2000), 0);
    assert_int_equal(h.type, IPC_RING_RESP);
    r->efd = efd;
    r->efd_up = efd >= 0;
    return st;
}

static void ring_send(int fd, struct ipc_ring *r, const void *frame, uint32_t len)
{
    assert_int_equal(ipc_ring_put(r, frame, len), 0);
    assert_int_equal(ipc_ring_ring(r, ipc_ring_need_bell(r), fd, 1000), 0);
}

static int32_t ring_answer_within(struct ipc_ring *r, int ms)
{
    int32_t st;
    int64_t end = now_ms() + ms;
    while (now_ms() < end) {
        int got = ipc_ring_take_answer(r, &st);
        assert_true(got >= 0);
        if (got)
            return st;
        ipc_ring_wait_answer(r, 10000);
    }
    return -1000;
}

struct recv_job {
    struct side *s;
    uint64_t off, tag, got;
    int rc;
};

static void *recv_main(void *arg)
{
    struct recv_job *j = arg;
    j->rc = xfer_recv(j->s->e, j->s->r, j->off, 64, j->s->p, j->tag, &j->got, DEADLINE);
    return NULL;
}

/* from's message of 40 bytes reaches to (a RECV waiting in a thread). */
static void one_way(struct side *from, struct side *to, uint64_t tag)
{
    uint8_t *out = xfer_region_ptr(from->r), *in = (uint8_t *)xfer_region_ptr(to->r) + 4096;
    for (int i = 0; i < 40; i++)
        out[i] = (uint8_t)(tag * 7 + (uint64_t)i);
    struct recv_job j = {.s = to, .off = 4096, .tag = tag};
    pthread_t th;
    pthread_create(&th, NULL, recv_main, &j);
    assert_int_equal(xfer_send(from->e, from->r, 0, 40, from->p, tag, DEADLINE), 0);
    pthread_join(th, NULL);
    assert_int_equal(j.rc, 0);
    assert_int_equal(j.got, 40);
    assert_memory_equal(in, out, 40);
}

/* B's real messages still reach A, and A's B. */
static void still_serves(struct side *A, struct side *B, uint64_t tag)
{
    one_way(B, A, tag);
    one_way(A, B, tag);
}

enum scribble { HEAD_ODD, HEAD_FAR, BAD_SEQ, BAD_LEN, LEN_PAST_HEAD, ANSWERS_TAIL, NSCRIBBLE };

static void scribble(int fd, struct ipc_ring *r, enum scribble k)
{
    static uint8_t junk[64];
    memset(junk, 0xab, sizeof(junk));
    uint64_t at = r->req_pos;
    uint32_t hdr[2];
    switch (k) {
    case HEAD_ODD:
        __atomic_store_n(&r->shm->req.head, at + 3, __ATOMIC_RELEASE);
        break;
    case HEAD_FAR:
        __atomic_store_n(&r->shm->req.head, at + 2ull * IPC_RING_REQ_BYTES, __ATOMIC_RELEASE);
        break;
    case BAD_SEQ:
        r->req_seq += 5;
        assert_int_equal(ipc_ring_put(r, junk, sizeof(junk)), 0);
        break;
    case BAD_LEN:       /* a record claiming 4 GiB */
    case LEN_PAST_HEAD: /* a record longer than what was published */
        hdr[0] = k == BAD_LEN ? 0xfffffff0u : 4000u;
        hdr[1] = r->req_seq;
        memcpy(r->req + at % IPC_RING_REQ_BYTES, hdr, sizeof(hdr));
        __atomic_store_n(&r->shm->req.head, at + 16, __ATOMIC_RELEASE);
        break;
    case ANSWERS_TAIL: /* the answers' read index ahead of what was written */
        __atomic_store_n(&r->shm->resp.tail, 12345, __ATOMIC_RELEASE);
        assert_int_equal(ipc_ring_put(r, junk, sizeof(junk)), 0);
        break;
    case NSCRIBBLE:
        break;
    }
    assert_int_equal(ipc_send(fd, IPC_RING_BELL, 0, NULL, 0, -1, 1000), 0);
}

static void test_scribble(void **state)
{
    (void)state;
    unsetenv("XFER_IPC_RING"); /* on, whatever the environment says */
    struct side A = {0}, B = {0};
    linked(&A, &B, "ring-a", "ring-b");
    still_serves(&A, &B, 1);
    for (int k = 0; k < NSCRIBBLE; k++) {
        uint32_t flags = 0;
        int raw = raw_as(&A, &B, &flags);
        assert_true(flags & IPC_HELLO_RING);
        struct ipc_ring r;
        int rfd = -1;
        assert_int_equal(ipc_ring_create(&r, &rfd), 0);
        assert_int_equal(ring_req(raw, rfd), 0);
        close(rfd);
        /* a well-formed request with a garbage engine frame: answered, kept */
        uint8_t junk[64];
        memset(junk, 0xab, sizeof(junk));
        ring_send(raw, &r, junk, sizeof(junk));
        assert_int_equal(ring_answer_within(&r, DEADLINE), -XFER_EPROTO);
        scribble(raw, &r, (enum scribble)k);
        assert_true(closed_within(raw, IO_TIMEOUT + 4000));
        close(raw);
        ipc_ring_unmap(&r);
        still_serves(&A, &B, 10 + (uint64_t)k);
    }
    xfer_engine_free(A.e);
    xfer_engine_free(B.e);
}

/* A peer whose ring is refused goes on over the socket. */
static void socket_still_carries(int raw)
{
    uint8_t junk[64];
    memset(junk, 0xab, sizeof(junk));
    assert_int_equal(ipc_send(raw, IPC_MSG_REQ, 1, junk, sizeof(junk), -1, 1000), 0);
    struct ipc_hdr h;
    int32_t st = 0;
    assert_int_equal(ipc_recv(raw, &h, &st, sizeof(st), NULL, DEADLINE), 0);
    assert_int_equal(h.type, IPC_MSG_RESP);
    assert_int_equal(st, -XFER_EPROTO);
}

static void test_fallback(void **state)
{
    (void)state;
    unsetenv("XFER_IPC_RING");
    struct side A = {0}, B = {0};
    linked(&A, &B, "ringf-a", "ringf-b");
    /* an unsealed memfd (the peer could shrink it under us): refused */
    uint32_t flags = 0;
    int raw = raw_as(&A, &B, &flags);
    int mfd = memfd_create("not-sealed", MFD_CLOEXEC);
    assert_int_equal(ftruncate(mfd, (off_t)ipc_ring_size()), 0);
    assert_int_equal(ring_req(raw, mfd), -XFER_EPROTO);
    close(mfd);
    socket_still_carries(raw);
    close(raw);
    xfer_engine_free(A.e);
    xfer_engine_free(B.e);

    /* the owner off: no ring offered, a request for one refused */
    setenv("XFER_IPC_RING", "0", 1);
    side_new(&A, "ringf-c");
    unsetenv("XFER_IPC_RING");
    side_new(&B, "ringf-d");
    raw = raw_as(&A, &B, &flags);
    assert_int_equal(flags & IPC_HELLO_RING, 0);
    struct ipc_ring r;
    int rfd = -1;
    assert_int_equal(ipc_ring_create(&r, &rfd), 0);
    assert_int_equal(ring_req(raw, rfd), -XFER_ENOTSUP);
    close(rfd);
    ipc_ring_unmap(&r);
    socket_still_carries(raw);
    close(raw);
    assert_int_equal(xfer_peer_add(A.e, &B.d, &A.p), 0);
    assert_int_equal(xfer_peer_add(B.e, &A.d, &B.p), 0);
    assert_int_equal(xfer_peer_connect(B.p), 0); /* B (ring on) to A (off) */
    setenv("XFER_IPC_RING", "0", 1);
    assert_int_equal(xfer_peer_connect(A.p), 0); /* A (off) to B (on) */
    unsetenv("XFER_IPC_RING");
    assert_int_equal(xfer_peer_transport(A.p), XFER_TRANSPORT_IPC);
    for (uint64_t t = 0; t < 50; t++)
        still_serves(&A, &B, 100 + t);
    xfer_engine_free(A.e);
    xfer_engine_free(B.e);
}

/* Until the owner's readers of r wait as how says (IPC_SLEEP_*), at most ms. */
static bool waiting_within(struct ipc_ring *r, uint32_t how, int ms)
{
    int64_t end = now_ms() + ms;
    while (__atomic_load_n(&r->shm->req.sleep, __ATOMIC_ACQUIRE) != how) {
        if (now_ms() > end)
            return false;
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    return true;
}

/* An eager RTS of 40 bytes with tag from b, put in the ring without a bell. */
static void rts_put(struct ipc_ring *r, const struct side *b, uint64_t tag)
{
    static uint8_t frame[XFER_MSG_HDR_LEN + XFER_MSG_RTS_BODY + 64];
    uint8_t bytes[40];
    for (int i = 0; i < 40; i++)
        bytes[i] = (uint8_t)(tag * 7 + (uint64_t)i);
    struct xfer_msg_rts m = {.send_id = 9000 + tag, .tag = tag, .len = 40, .eager = bytes};
    xfer_region_describe(b->r, &m.src);
    size_t n = xfer_msg_encode_rts(tag, &m, frame);
    assert_int_equal(ipc_ring_put(r, frame, (uint32_t)n), 0);
}

static void test_spinning_waiter(void **state)
{
    (void)state;
    unsetenv("XFER_IPC_RING");
    setenv("XFER_BUSY_POLL_US", "1000000", 1); /* RECV waiters spin through each slice */
    struct side A = {0}, B = {0};
    linked(&A, &B, "ringw-a", "ringw-b");
    unsetenv("XFER_BUSY_POLL_US");
    int raw = raw_as(&A, &B, NULL); /* A's newest connection from "ringw-b" */
    struct ipc_ring r;
    int rfd = -1;
    assert_int_equal(ipc_ring_create(&r, &rfd), 0);
    assert_int_equal(ring_req(raw, rfd), 0);
    close(rfd);
    for (uint64_t tag = 1; tag <= 20; tag++) {
        struct recv_job j = {.s = &A, .off = 4096, .tag = tag};
        pthread_t th;
        pthread_create(&th, NULL, recv_main, &j);
        assert_true(waiting_within(&r, IPC_SLEEP_SPIN, DEADLINE));
        rts_put(&r, &B, tag); /* no bell: only a spinner looks */
        assert_int_equal(ring_answer_within(&r, DEADLINE), XFER_MSG_DELIVERED);
        pthread_join(th, NULL);
        assert_int_equal(j.rc, 0);
        assert_int_equal(j.got, 40);
        assert_int_equal(((uint8_t *)xfer_region_ptr(A.r))[4096 + 39], (uint8_t)(tag * 7 + 39));
    }
    /* a corrupt index seen by the spinner: that connection ends, A goes on */
    struct recv_job j = {.s = &A, .off = 4096, .tag = 99};
    pthread_t th;
    pthread_create(&th, NULL, recv_main, &j);
    assert_true(waiting_within(&r, IPC_SLEEP_SPIN, DEADLINE));
    __atomic_store_n(&r.shm->req.head, r.req_pos + 3, __ATOMIC_RELEASE);
    assert_true(closed_within(raw, IO_TIMEOUT + 4000));
    /* the RECV is still there: B's own SEND (on its real connection) meets it */
    assert_int_equal(xfer_send(B.e, B.r, 0, 40, B.p, 99, DEADLINE), 0);
    pthread_join(th, NULL);
    assert_int_equal(j.rc, 0);
    assert_int_equal(j.got, 40);
    close(raw);
    ipc_ring_unmap(&r);
    still_serves(&A, &B, 200);
    xfer_engine_free(A.e);
    xfer_engine_free(B.e);
}

/* A RECV whose waiter sleeps (no busy poll) sleeps on the ring's eventfd,
 * not on the socket: its initiator is told to write that (IPC_SLEEP_EFD)
 * and the waiter wakes and takes the frame (matched on arrival). An
 * initiator that takes no eventfd (features 0: one built before) gets none
 * and rings the bell on the socket as before. */
static void test_sleeping_waiter(void **state)
{
    (void)state;
    unsetenv("XFER_IPC_RING");
    struct side A = {0}, B = {0};
    linked(&A, &B, "ringz-a", "ringz-b");
    for (int old = 0; old < 2; old++) {
        int raw = raw_as(&A, &B, NULL);
        struct ipc_ring r;
        int rfd = -1;
        assert_int_equal(ipc_ring_create(&r, &rfd), 0);
        if (old)
            r.shm->features = 0;
        assert_int_equal(ring_req_keep(raw, rfd, &r), 0);
        close(rfd);
        assert_int_equal(r.efd_up, !old);
        int efd_bells = 0;
        for (uint64_t tag = 1; tag <= 20; tag++) {
            struct recv_job j = {.s = &A, .off = 4096, .tag = tag};
            pthread_t th;
            pthread_create(&th, NULL, recv_main, &j);
            if (!old) /* the RECV's waiter asleep on the eventfd */
                assert_true(waiting_within(&r, IPC_SLEEP_EFD, DEADLINE));
            rts_put(&r, &B, tag);
            unsigned bell = ipc_ring_need_bell(&r);
            efd_bells += bell == IPC_SLEEP_EFD;
            assert_int_equal(ipc_ring_ring(&r, bell, raw, 1000), 0);
            int32_t st = ring_answer_within(&r, DEADLINE);
            /* old: the RTS may come before the RECV (queued, answered 0) */
            assert_true(st == XFER_MSG_DELIVERED || (old && st == 0));
            pthread_join(th, NULL);
            assert_int_equal(j.rc, 0);
            assert_int_equal(j.got, 40);
            assert_int_equal(((uint8_t *)xfer_region_ptr(A.r))[4096 + 39], (uint8_t)(tag * 7 + 39));
        }
        printf("%s initiator: %d of 20 frames woke the waiter through its eventfd\n",
               old ? "old" : "new", efd_bells);
        assert_true(old ? efd_bells == 0 : efd_bells > 0);
        close(raw);
        ipc_ring_unmap(&r);
    }
    still_serves(&A, &B, 300);
    xfer_engine_free(A.e);
    xfer_engine_free(B.e);
}

#define FLOOD     48
#define FLOOD_LEN (60u << 10)

/* Reads FLOOD notifications of FLOOD_LEN bytes, the i-th filled with i + 1:
 * 0, or what was wrong. */
static int read_flood(xfer_engine *e)
{
    for (int got = 0; got < FLOOD;) {
        struct xfer_notif *n[8];
        if (xfer_notif_wait(e, NULL, DEADLINE) <= 0)
            return 22;
        int k = xfer_notif_poll(e, n, 8);
        for (int j = 0; j < k; j++, got++) {
            bool ok = n[j]->len == FLOOD_LEN && n[j]->data[0] == got + 1 &&
                      n[j]->data[FLOOD_LEN - 1] == got + 1;
            xfer_notif_free(n[j]);
            if (!ok)
                return 23;
        }
    }
    return 0;
}

/* B submits FLOOD standalone notifications of FLOOD_LEN bytes to A, the
 * i-th filled with i + 1, without waiting for any (read_flood's order). */
static void send_flood(struct side *B, xfer_batch **b, int deadline_ms)
{
    static uint8_t msg[FLOOD_LEN];
    for (int i = 0; i < FLOOD; i++) {
        int err = 0;
        b[i] = xfer_batch_new(B->e, &err);
        assert_non_null(b[i]);
        memset(msg, i + 1, sizeof(msg));
        assert_int_equal(xfer_batch_notify(b[i], B->p, msg, sizeof(msg)), 0);
        assert_int_equal(xfer_batch_submit(b[i], deadline_ms), 0);
    }
}

/* Every batch of the flood ends 0. */
static void end_flood(xfer_batch **b, int deadline_ms)
{
    for (int i = 0; i < FLOOD; i++) {
        assert_int_equal(xfer_batch_wait(b[i], deadline_ms), 0);
        xfer_batch_free(b[i]);
    }
}

/* Frames of nearly the largest size, back to back: 48 standalone
 * notifications of 60 KiB (2.8 MiB through the 512 KiB ring, wrapping it
 * several times) submitted without waiting while A reads none of them;
 * every batch ends 0 and A reads them all, in order, byte for byte. */
static void test_full_ring(void **state)
{
    (void)state;
    unsetenv("XFER_IPC_RING");
    struct side A = {0}, B = {0};
    linked(&A, &B, "ringx-a", "ringx-b");
    xfer_batch *b[FLOOD];
    send_flood(&B, b, DEADLINE);
    end_flood(b, DEADLINE);
    assert_int_equal(read_flood(A.e), 0);
    still_serves(&A, &B, 7);
    xfer_engine_free(A.e);
    xfer_engine_free(B.e);
}

/* The owner stopped (SIGSTOP, another process) while its peer floods it:
 * the ring fills, the sender's writer waits for room (reading the answers
 * that come), and once the owner runs again everything arrives: every
 * batch ends 0, the owner reads all of them, in order. */
static int stalled_owner(int to_parent, int from_parent)
{
    struct side A = {0}, B = {0};
    side_new(&A, "ringst-a");
    if (write(to_parent, &A.d, sizeof(A.d)) != sizeof(A.d) ||
        read(from_parent, &B.d, sizeof(B.d)) != sizeof(B.d) ||
        xfer_peer_add(A.e, &B.d, &A.p) != 0 || write(to_parent, "r", 1) != 1)
        return 20;
    char go;
    if (read(from_parent, &go, 1) != 1) /* the flood is on its way */
        return 21;
    int rc = read_flood(A.e);
    xfer_engine_free(A.e);
    return rc;
}

static void test_stalled_owner(void **state)
{
    (void)state;
    unsetenv("XFER_IPC_RING");
    int up[2], down[2];
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(down), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(stalled_owner(up[1], down[0]));
    struct side B = {0};
    struct xfer_engine_config cfg;
    xfer_engine_config_init(&cfg);
    cfg.node_id = "ringst-b";
    cfg.transports = XFER_TRANSPORT_IPC;
    cfg.io_timeout_ms = 5000; /* longer than the stop */
    int rc;
    B.e = xfer_engine_new(&cfg, &rc);
    assert_non_null(B.e);
    xfer_engine_describe(B.e, &B.d);
    struct xfer_peer_desc ad;
    char ready;
    assert_int_equal(read(up[0], &ad, sizeof(ad)), (ssize_t)sizeof(ad));
    assert_int_equal(write(down[1], &B.d, sizeof(B.d)), (ssize_t)sizeof(B.d));
    assert_int_equal(read(up[0], &ready, 1), 1);
    assert_int_equal(xfer_peer_add(B.e, &ad, &B.p), 0);
    assert_int_equal(xfer_peer_connect(B.p), 0);
    assert_int_equal(xfer_peer_transport(B.p), XFER_TRANSPORT_IPC);
    assert_int_equal(kill(pid, SIGSTOP), 0);
    xfer_batch *b[FLOOD];
    int64_t t0 = now_ms();
    send_flood(&B, b, 3 * DEADLINE);
    struct timespec ts = {0, 300 * 1000000L}; /* the ring is full meanwhile */
    nanosleep(&ts, NULL);
    assert_int_equal(xfer_batch_poll(b[FLOOD - 1]), -XFER_EINPROGRESS);
    assert_int_equal(kill(pid, SIGCONT), 0);
    assert_int_equal(write(down[1], "g", 1), 1);
    end_flood(b, 3 * DEADLINE);
    printf("stalled owner: %d x %u KiB in %lld ms\n", FLOOD, FLOOD_LEN >> 10,
           (long long)(now_ms() - t0));
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    xfer_engine_free(B.e);
    close(up[0]);
    close(up[1]);
    close(down[0]);
    close(down[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_race),           cmocka_unit_test(test_scribble),
        cmocka_unit_test(test_fallback),       cmocka_unit_test(test_full_ring),
        cmocka_unit_test(test_stalled_owner),  cmocka_unit_test(test_spinning_waiter),
        cmocka_unit_test(test_sleeping_waiter)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
