/*
 * Direct copies (issue 15, docs/ipc.md "direct path"): an initiator copies
 * through its mapping of the owner's memfd without asking the owner per
 * item, while the owner can still withdraw a region before it goes.
 *
 * Owner: the connection's control page holds one slot per lent region (key
 * = id << 32 | gen, pins). A loan keeps one pin on the region, so a
 * deregistration waits for the owner to withdraw it: the owner clears key,
 * then waits until the peer's pins are 0. Initiator: adds a pin, then reads
 * key; only if key still names its (id, gen) does it copy, then drops the
 * pin. Both use sequentially consistent operations, so one of them sees the
 * other: after a withdrawal returns no copy is running and none starts.
 * Access stays with the kernel: a region the peer may not write is mapped
 * read-only (ipc_serve.c passes a read-only fd), and write-only regions are
 * never lent (x86 pages cannot be write-only).
 */
#include "ipc.h"
#include "ipc_map.h"
#include "xfer_io.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CTL_BYTES (IPC_CTL_SLOTS * sizeof(struct ipc_ctl_slot))

_Static_assert(sizeof(struct ipc_ctl_slot) == 64, "one cache line per control slot");

/* ---- owner ----------------------------------------------------------------- */

bool ipc_direct_allowed(xfer_region *r)
{
    if (xfer_env_off("XFER_IPC_DIRECT"))
        return false;
    struct xfer_region_desc d;
    xfer_region_describe(r, &d);
    if (xfer_region_guard_count(r) != 0)
        return false;
    if (xfer_region_kind(r) == XFER_MEM_CUDA) { /* GPU loans: XFER_IPC_DIRECT_GPU=0 turns off */
        return !xfer_env_off("XFER_IPC_DIRECT_GPU");
    }
    return xfer_region_kind(r) == XFER_MEM_HOST && xfer_region_memfd(r) >= 0 &&
           (d.access & XFER_ACCESS_R);
}

int ipc_loans_init(struct ipc_loans *l, int sock, int timeout_ms)
{
    memset(l, 0, sizeof(*l));
    l->sock = sock;
    l->timeout_ms = timeout_ms;
    l->ctl_fd = memfd_create("xfer-ipc-ctl", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (l->ctl_fd < 0 || ftruncate(l->ctl_fd, CTL_BYTES) < 0 ||
        fcntl(l->ctl_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
        goto fail;
    l->ctl = mmap(NULL, CTL_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, l->ctl_fd, 0);
    if (l->ctl == MAP_FAILED)
        goto fail;
    pthread_mutex_init(&l->mu, NULL);
    return 0;
fail:
    xfer_warn("ipc: no control page for direct copies (%s): every copy asks the owner",
              strerror(errno));
    if (l->ctl_fd >= 0)
        close(l->ctl_fd);
    l->ctl_fd = -1;
    l->ctl = NULL;
    return -XFER_EIO;
}

/* l->mu held: clears slot i's key, waits for the peer's copies in progress
 * (each holds its pin for one piece of at most IPC_DIRECT_PIECE bytes), and
 * drops the loan's pin. A peer whose pin stays past timeout_ms is stopped or
 * hung: its connection is shut down, which revokes all its access. */
static void withdraw(struct ipc_loans *l, uint32_t i)
{
    struct ipc_ctl_slot *s = &l->ctl[i];
    __atomic_store_n(&s->key, 0, __ATOMIC_SEQ_CST);
    int64_t start = xfer_now_ms();
    while (__atomic_load_n(&s->pins, __ATOMIC_SEQ_CST) != 0) {
        if (ipc_sock_hung_up(l->sock))
            break; /* the peer is gone (or we are stopping): nothing copies */
        if (xfer_now_ms() - start > l->timeout_ms) {
            xfer_warn("ipc: a peer has held a direct copy of a region for %d ms while it is "
                      "being deregistered: revoking its access (closing its connection)",
                      l->timeout_ms);
            shutdown(l->sock, SHUT_RDWR);
            break;
        }
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    xfer_region_release(l->r[i]);
    l->r[i] = NULL;
}

uint32_t ipc_loan_add(struct ipc_loans *l, xfer_engine *e, xfer_region *r, uint32_t id,
                      uint32_t gen)
{
    if (!l->ctl || !ipc_direct_allowed(r))
        return IPC_SLOT_NONE;
    int err = 0;
    xfer_region *pin = xfer_region_acquire(e, id, gen, XFER_OP_READ, 0, 0, &err);
    if (!pin)
        return IPC_SLOT_NONE;
    uint32_t slot = IPC_SLOT_NONE, free_slot = IPC_SLOT_NONE;
    pthread_mutex_lock(&l->mu);
    for (uint32_t i = 0; i < IPC_CTL_SLOTS && slot == IPC_SLOT_NONE; i++) {
        if (l->r[i] == pin)
            slot = i;
        else if (!l->r[i] && free_slot == IPC_SLOT_NONE)
            free_slot = i;
    }
    if (slot != IPC_SLOT_NONE) {
        xfer_region_release(pin); /* already lent: one pin per loan */
    } else if (free_slot != IPC_SLOT_NONE) {
        slot = free_slot;
        l->r[slot] = pin;
        __atomic_store_n(&l->ctl[slot].key, ipc_ctl_key(id, gen), __ATOMIC_SEQ_CST);
        /* A deregistration or a lease rule that came after our checks may
         * have looked for loans before this one existed: withdraw at once.
         * (Both mark the region before they look, under our lock.) */
        if (xfer_region_dying(pin) || xfer_region_guard_count(pin) > 0) {
            withdraw(l, slot);
            slot = IPC_SLOT_NONE;
        }
    } else {
        xfer_region_release(pin);
    }
    pthread_mutex_unlock(&l->mu);
    return slot;
}

void ipc_loans_withdraw(struct ipc_loans *l, xfer_region *r)
{
    if (!l->ctl)
        return;
    pthread_mutex_lock(&l->mu);
    for (uint32_t i = 0; i < IPC_CTL_SLOTS; i++)
        if (l->r[i] == r)
            withdraw(l, i);
    pthread_mutex_unlock(&l->mu);
}

void ipc_loans_withdraw_all(struct ipc_loans *l)
{
    if (!l->ctl)
        return;
    pthread_mutex_lock(&l->mu);
    for (uint32_t i = 0; i < IPC_CTL_SLOTS; i++)
        if (l->r[i])
            withdraw(l, i);
    pthread_mutex_unlock(&l->mu);
}

void ipc_loans_fini(struct ipc_loans *l)
{
    if (!l->ctl) {
        if (l->ctl_fd >= 0)
            close(l->ctl_fd);
        return;
    }
    ipc_loans_withdraw_all(l);
    munmap(l->ctl, CTL_BYTES);
    if (l->ctl_fd >= 0)
        close(l->ctl_fd);
    pthread_mutex_destroy(&l->mu);
    l->ctl = NULL;
}

/* ---- initiator ------------------------------------------------------------- */

void ipc_direct_init(struct ipc_direct_table *t, int fd, uint32_t nslots)
{
    memset(t, 0, sizeof(*t));
    /* Writers first: posting threads hold the read side back to back, and a
     * withdrawal (unlist) must not wait for a gap between them. */
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&t->lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    const char *env = getenv("XFER_IPC_DIRECT_MAX");
    long long max = env ? atoll(env) : -1; /* default: no limit */
    t->max_item = max >= 0 ? (uint64_t)max : UINT64_MAX;
    bool off = xfer_env_off("XFER_IPC_DIRECT");
    if (fd >= 0 && !off && t->max_item > 0 && nslots == IPC_CTL_SLOTS) {
        void *p = mmap(NULL, CTL_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) {
            t->ctl = p;
            t->nslots = nslots;
        } else {
            xfer_warn("ipc: cannot map the owner's control page (%s): no direct copies",
                      strerror(errno));
        }
    }
    if (fd >= 0)
        close(fd);
}

void ipc_direct_fini(struct ipc_direct_table *t)
{
    ipc_direct_free(t->head); /* no copies run any more: post has returned */
    t->head = NULL;
    if (t->ctl)
        munmap(t->ctl, CTL_BYTES);
    t->ctl = NULL;
    pthread_rwlock_destroy(&t->lock);
}

/* The owner's memory as this side reaches it: the memfd mapping, or the
 * opened CUDA IPC mapping (NULL for CMA). */
static char *map_base(const struct ipc_map *m)
{
    return m->cuda ? (char *)ipc_cuda_import_ptr(m->cuda) : (char *)m->base;
}

void ipc_direct_note(struct ipc_direct_table *t, const struct ipc_map *m)
{
    bool gpu = m->mech == IPC_MECH_CUDA || m->mech == IPC_MECH_CUMEM;
    if (!t->ctl || (m->mech != IPC_MECH_MEMFD && !gpu) || m->ctl_slot >= t->nslots ||
        !map_base(m) || (gpu && !m->cuda))
        return;
    for (struct ipc_direct *d = t->head; d; d = d->next)
        if (d->id == m->id && d->gen == m->gen)
            return;
    struct ipc_direct *d = calloc(1, sizeof(*d));
    if (!d)
        return; /* the slow path still works */
    pthread_rwlock_wrlock(&t->lock);
    *d = (struct ipc_direct){.id = m->id,
                             .gen = m->gen,
                             .slot = m->ctl_slot,
                             .access = m->access,
                             .len = m->len,
                             .base = map_base(m),
                             .dev = gpu ? ipc_cuda_import_device(m->cuda) : -1,
                             .listed = true,
                             .next = t->head};
    t->head = d;
    pthread_rwlock_unlock(&t->lock);
}

struct ipc_direct *ipc_direct_unlist(struct ipc_direct_table *t, const struct ipc_map_cache *mc)
{
    struct ipc_direct *gone = NULL, **pp = &t->head;
    pthread_rwlock_wrlock(&t->lock);
    while (*pp) {
        struct ipc_direct *d = *pp;
        bool live = false;
        for (const struct ipc_map *m = mc->live; m && !live; m = m->next)
            live = m->id == d->id && m->gen == d->gen && map_base(m) == d->base;
        if (live) {
            pp = &d->next;
            continue;
        }
        *pp = d->next;
        d->listed = false;
        d->next = gone;
        gone = d;
    }
    pthread_rwlock_unlock(&t->lock);
    return gone;
}

void ipc_direct_free(struct ipc_direct *list)
{
    while (list) {
        struct ipc_direct *d = list;
        list = d->next;
        while (__atomic_load_n(&d->users, __ATOMIC_ACQUIRE) > 0)
            sched_yield(); /* copies and queued pieces (they fail fast once withdrawn) */
        free(d);
    }
}

/* The listed entry for it's remote region, if the owner's answer allows
 * it's op; a user is counted. Not moved to the front (readers share the
 * lock): a connection lists the regions its owner lent, a few. */
static struct ipc_direct *direct_find(struct ipc_direct_table *t, const struct xfer_item *it)
{
    unsigned need = it->op == XFER_OP_READ ? XFER_ACCESS_R : XFER_ACCESS_W;
    for (struct ipc_direct *d = t->head; d; d = d->next) {
        if (d->id != it->remote_id || d->gen != it->remote_gen)
            continue;
        /* The owner's answer decides, not the published descriptor. */
        if (!(d->access & need))
            return NULL;
        __atomic_add_fetch(&d->users, 1, __ATOMIC_ACQ_REL);
        return d;
    }
    return NULL;
}

struct ipc_direct *ipc_direct_get(struct ipc_direct_table *t, const struct xfer_item *it)
{
    if (!t->ctl || it->len > t->max_item || xfer_region_kind(it->local) != XFER_MEM_HOST)
        return NULL;
    struct ipc_direct *d = direct_find(t, it);
    if (d && (d->dev >= 0 || !xfer_range_ok(it->remote_off, it->len, d->len))) {
        __atomic_sub_fetch(&d->users, 1, __ATOMIC_ACQ_REL);
        return NULL; /* a GPU loan, or outside: the owner answers */
    }
    return d;
}

struct ipc_direct *ipc_direct_get_gpu(struct ipc_direct_table *t, const struct xfer_item *it)
{
    if (!t->ctl || xfer_region_kind(it->local) != XFER_MEM_CUDA)
        return NULL;
    struct ipc_direct *d = direct_find(t, it);
    if (d && d->dev < 0) {
        __atomic_sub_fetch(&d->users, 1, __ATOMIC_ACQ_REL);
        return NULL;
    }
    return d;
}

int ipc_direct_piece(struct ipc_direct_table *t, const struct ipc_direct *d, xfer_batch *b,
                     size_t i, uint64_t off, uint64_t len)
{
    const struct xfer_item *it = xfer_batch_item(b, i);
    struct ipc_ctl_slot *s = &t->ctl[d->slot];
    if (!xfer_batch_io_begin(b, i))
        return -1; /* ended (cancelled, timed out): its memory is off limits */
    int rc = 0;
    __atomic_add_fetch(&s->pins, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&s->key, __ATOMIC_SEQ_CST) == ipc_ctl_key(d->id, d->gen)) {
        char *local = (char *)xfer_region_ptr(it->local) + it->local_off + off;
        char *remote = d->base + it->remote_off + off;
        if (it->op == XFER_OP_READ)
            memcpy(local, remote, len);
        else
            memcpy(remote, local, len);
    } else {
        rc = 1; /* withdrawn: the owner will say why */
    }
    __atomic_sub_fetch(&s->pins, 1, __ATOMIC_SEQ_CST);
    xfer_batch_io_end(b, i);
    if (rc == 0)
        xfer_batch_chunk_done(b, i, len, 0, NULL);
    return rc;
}

int ipc_direct_copy(struct ipc_direct_table *t, struct ipc_direct *d, xfer_batch *b, size_t i)
{
    uint64_t len = xfer_batch_item(b, i)->len, off = 0;
    int rc = 0;
    do { /* one pin per piece: a withdrawal waits for one piece at most */
        uint64_t n = len - off < IPC_DIRECT_PIECE ? len - off : IPC_DIRECT_PIECE;
        rc = ipc_direct_piece(t, d, b, i, off, n);
        off += n;
    } while (rc == 0 && off < len);
    __atomic_sub_fetch(&d->users, 1, __ATOMIC_ACQ_REL);
    return rc == 1;
}
