/*
 * The shared-memory message ring of an ipc connection (ipc_ring.h; why and
 * the wake-up protocol: docs/ipc.md, "Message ring").
 *
 * Requests: records of an 8-byte header (frame length, frame number) and
 * the frame, padded to 8 bytes, in a byte ring; a frame may wrap around the
 * end (copied in two pieces), a header never does (8-byte positions, a
 * ring of a multiple of 8). Answers: one slot each (status, index).
 */
#include "ipc_ring.h"
#include "ipc.h"
#include "xfer.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define REC_HDR 8u
#define SEALS   (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

struct rec {
    uint32_t len, seq;
};

static uint64_t rec_bytes(uint32_t len)
{
    return REC_HDR + (((uint64_t)len + 7) & ~(uint64_t)7);
}

size_t ipc_ring_size(void)
{
    return IPC_RING_HDR_BYTES + IPC_RING_REQ_BYTES +
           IPC_RING_RESP_SLOTS * sizeof(struct ipc_ring_slot);
}

bool ipc_ring_enabled(void)
{
    return !xfer_env_off("XFER_IPC_RING");
}

static int map(struct ipc_ring *r, int fd)
{
    size_t len = ipc_ring_size();
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return -XFER_ENOMEM;
    memset(r, 0, sizeof(*r));
    r->shm = p;
    r->req = (char *)p + IPC_RING_HDR_BYTES;
    r->resp = (struct ipc_ring_slot *)(r->req + IPC_RING_REQ_BYTES);
    r->map_len = len;
    return 0;
}

int ipc_ring_create(struct ipc_ring *r, int *fd_out)
{
    int fd = memfd_create("xfer-ipc-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -XFER_ENOMEM;
    int rc = ftruncate(fd, (off_t)ipc_ring_size()) == 0 && fcntl(fd, F_ADD_SEALS, SEALS) == 0
                 ? map(r, fd)
                 : -XFER_ENOMEM;
    if (rc < 0) {
        close(fd);
        return rc;
    }
    r->shm->magic = IPC_RING_MAGIC;
    r->shm->req_bytes = IPC_RING_REQ_BYTES;
    r->shm->resp_slots = IPC_RING_RESP_SLOTS;
    r->shm->features = IPC_RING_F_EFD;
    *fd_out = fd;
    return 0;
}

int ipc_ring_attach(struct ipc_ring *r, int fd)
{
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & SEALS) != SEALS || fstat(fd, &st) < 0 ||
        (uint64_t)st.st_size != ipc_ring_size())
        return -XFER_EPROTO;
    int rc = map(r, fd);
    if (rc == 0 && (r->shm->magic != IPC_RING_MAGIC || r->shm->req_bytes != IPC_RING_REQ_BYTES ||
                    r->shm->resp_slots != IPC_RING_RESP_SLOTS)) {
        ipc_ring_unmap(r);
        return -XFER_EPROTO;
    }
    if (rc == 0) { /* the indices start where the page says (a fresh one: 0) */
        r->req_pos = __atomic_load_n(&r->shm->req.tail, __ATOMIC_ACQUIRE);
        r->resp_pos = __atomic_load_n(&r->shm->resp.head, __ATOMIC_ACQUIRE);
        if (r->req_pos != 0 || r->resp_pos != 0) {
            ipc_ring_unmap(r);
            return -XFER_EPROTO;
        }
        __atomic_store_n(&r->shm->req.sleep, IPC_SLEEP_SOCK,
                         __ATOMIC_SEQ_CST); /* nobody spins yet */
    }
    return rc;
}

void ipc_ring_unmap(struct ipc_ring *r)
{
    if (r->efd_up)
        close(r->efd);
    if (r->shm)
        munmap(r->shm, r->map_len);
    memset(r, 0, sizeof(*r));
}

/* Copies len bytes out of / into the ring at position pos (wrapping). */
static void ring_read(const char *ring, uint64_t pos, void *dst, size_t len)
{
    size_t off = (size_t)(pos % IPC_RING_REQ_BYTES);
    size_t first = IPC_RING_REQ_BYTES - off < len ? IPC_RING_REQ_BYTES - off : len;
    memcpy(dst, ring + off, first);
    memcpy((char *)dst + first, ring, len - first);
}

static void ring_write(char *ring, uint64_t pos, const void *src, size_t len)
{
    size_t off = (size_t)(pos % IPC_RING_REQ_BYTES);
    size_t first = IPC_RING_REQ_BYTES - off < len ? IPC_RING_REQ_BYTES - off : len;
    memcpy(ring + off, src, first);
    memcpy(ring, (const char *)src + first, len - first);
}

int ipc_ring_put(struct ipc_ring *r, const void *frame, uint32_t len)
{
    uint64_t tail = __atomic_load_n(&r->shm->req.tail, __ATOMIC_ACQUIRE);
    uint64_t head = r->req_pos;
    if (tail > head || head - tail > IPC_RING_REQ_BYTES)
        return -XFER_EPROTO;
    uint64_t need = rec_bytes(len);
    if (need > IPC_RING_REQ_BYTES)
        return -XFER_EINVAL;
    if (IPC_RING_REQ_BYTES - (head - tail) < need)
        return -XFER_EBUSY;
    struct rec h = {.len = len, .seq = r->req_seq};
    ring_write(r->req, head, &h, sizeof(h));
    ring_write(r->req, head + REC_HDR, frame, len);
    r->req_pos = head + need;
    r->req_seq++;
    __atomic_store_n(&r->shm->req.head, r->req_pos, __ATOMIC_RELEASE);
    return 0;
}

unsigned ipc_ring_need_bell(struct ipc_ring *r)
{
    /* Dekker with ipc_ring_sleep / ipc_ring_bell_taken: head stored,
     * fence, then their word loaded. */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    uint32_t how = __atomic_load_n(&r->shm->req.sleep, __ATOMIC_RELAXED);
    if (how == IPC_SLEEP_SPIN)
        return 0;
    if (how == IPC_SLEEP_EFD && r->efd_up)
        return IPC_SLEEP_EFD;
    /* IPC_SLEEP_SOCK, or anything else the page says: the socket */
    return __atomic_exchange_n(&r->shm->req.belled, 1, __ATOMIC_SEQ_CST) == 0 ? IPC_SLEEP_SOCK : 0;
}

int ipc_ring_ring(struct ipc_ring *r, unsigned bell, int fd, int timeout_ms)
{
    uint64_t one = 1;
    if (bell == IPC_SLEEP_EFD)
        return write(r->efd, &one, sizeof(one)) == sizeof(one) ? 0 : -XFER_ECONN;
    if (bell == IPC_SLEEP_SOCK)
        return ipc_send(fd, IPC_RING_BELL, 0, NULL, 0, -1, timeout_ms);
    return 0;
}

int ipc_ring_make_efd(struct ipc_ring *r)
{
    if (!(__atomic_load_n(&r->shm->features, __ATOMIC_RELAXED) & IPC_RING_F_EFD))
        return -1;
    r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    r->efd_up = r->efd >= 0;
    return r->efd_up ? r->efd : -1;
}

int ipc_ring_get(struct ipc_ring *r, void *buf, uint32_t max, uint32_t *len)
{
    uint64_t head = __atomic_load_n(&r->shm->req.head, __ATOMIC_ACQUIRE);
    uint64_t tail = r->req_pos;
    if (head == tail)
        return 0;
    if (head < tail || head - tail > IPC_RING_REQ_BYTES || head % 8)
        return -XFER_EPROTO;
    struct rec h;
    ring_read(r->req, tail, &h, sizeof(h));
    if (h.seq != r->req_seq || h.len > max || rec_bytes(h.len) > head - tail)
        return -XFER_EPROTO;
    ring_read(r->req, tail + REC_HDR, buf, h.len); /* ours from here on */
    r->req_pos = tail + rec_bytes(h.len);
    r->req_seq++;
    __atomic_store_n(&r->shm->req.tail, r->req_pos, __ATOMIC_RELEASE);
    *len = h.len;
    return 1;
}

bool ipc_ring_pending(const struct ipc_ring *r)
{
    return __atomic_load_n(&r->shm->req.head, __ATOMIC_ACQUIRE) !=
           __atomic_load_n(&r->shm->req.tail, __ATOMIC_RELAXED);
}

int ipc_ring_peek_kind(const struct ipc_ring *r)
{
    uint64_t head = __atomic_load_n(&r->shm->req.head, __ATOMIC_ACQUIRE);
    uint64_t tail = r->req_pos;
    if (head <= tail || head - tail > IPC_RING_REQ_BYTES)
        return -1;
    struct rec h;
    ring_read(r->req, tail, &h, sizeof(h));
    if (h.len < 6 || rec_bytes(h.len) > head - tail)
        return -1;
    uint8_t kind;
    ring_read(r->req, tail + REC_HDR + 5, &kind, 1);
    return kind;
}

void ipc_ring_sleep(struct ipc_ring *r, uint32_t how)
{
    __atomic_store_n(&r->shm->req.sleep, how, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

void ipc_ring_bell_taken(struct ipc_ring *r)
{
    __atomic_store_n(&r->shm->req.belled, 0, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

static long futex(uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, addr, op, val, ts, NULL, 0); /* shared: not FUTEX_PRIVATE */
}

int ipc_ring_answer(struct ipc_ring *r, int32_t status)
{
    uint64_t tail = __atomic_load_n(&r->shm->resp.tail, __ATOMIC_ACQUIRE);
    uint64_t head = r->resp_pos;
    if (tail > head || head - tail > IPC_RING_RESP_SLOTS)
        return -XFER_EPROTO;
    if (head - tail == IPC_RING_RESP_SLOTS)
        return -XFER_EBUSY;
    struct ipc_ring_slot *s = &r->resp[head % IPC_RING_RESP_SLOTS];
    s->status = status;
    s->seq = (uint32_t)head;
    r->resp_pos = head + 1;
    __atomic_store_n(&r->shm->resp.head, r->resp_pos, __ATOMIC_RELEASE);
    __atomic_add_fetch(&r->shm->resp.fut, 1, __ATOMIC_SEQ_CST);
    /* Dekker with ipc_ring_wait_answer: answer stored, fence, sleep loaded */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(&r->shm->resp.sleep, __ATOMIC_RELAXED))
        futex(&r->shm->resp.fut, FUTEX_WAKE, 1, NULL);
    return 0;
}

int ipc_ring_take_answer(struct ipc_ring *r, int32_t *status)
{
    uint64_t head = __atomic_load_n(&r->shm->resp.head, __ATOMIC_ACQUIRE);
    uint64_t tail = r->resp_pos;
    if (head == tail)
        return 0;
    if (head < tail || head - tail > IPC_RING_RESP_SLOTS)
        return -XFER_EPROTO;
    struct ipc_ring_slot s = r->resp[tail % IPC_RING_RESP_SLOTS];
    if (s.seq != (uint32_t)tail)
        return -XFER_EPROTO;
    r->resp_pos = tail + 1;
    __atomic_store_n(&r->shm->resp.tail, r->resp_pos, __ATOMIC_RELEASE);
    *status = s.status;
    return 1;
}

void ipc_ring_wait_answer(struct ipc_ring *r, int64_t timeout_us)
{
    if (timeout_us <= 0)
        return;
    __atomic_store_n(&r->shm->resp.sleep, 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    uint32_t v = __atomic_load_n(&r->shm->resp.fut, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&r->shm->resp.head, __ATOMIC_ACQUIRE) == r->resp_pos) {
        struct timespec ts = {(time_t)(timeout_us / 1000000), (long)(timeout_us % 1000000) * 1000};
        futex(&r->shm->resp.fut, FUTEX_WAIT, v, &ts); /* EAGAIN: it moved meanwhile */
    }
    __atomic_store_n(&r->shm->resp.sleep, 0, __ATOMIC_RELAXED);
}
