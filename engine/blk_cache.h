/*
 * A bounded, lock-free cache of equal-sized heap blocks (docs/notify.md,
 * "Per-message allocations"). The message path allocates a few small
 * objects per message on one thread and frees them on another (the
 * submitter builds a frame, a progress thread frees it with the answer);
 * glibc's per-thread cache cannot serve that flow, so each such pair went
 * through the arena (~300 instructions and its lock). Here a block goes
 * back into one of XFER_BLK_SLOTS slots, whichever thread frees it, and
 * the next allocation of that size takes it.
 *
 * Every cached block is an ordinary malloc() block of the cache's size:
 * code that frees one with free() (an error path) is still correct, the
 * cache just holds one block fewer. A full cache frees (bounded memory), an
 * empty one mallocs (never fails for lack of cached blocks). Slots are
 * exchanged atomically and never followed as a list, so there is no ABA.
 * Under AddressSanitizer a cached block is poisoned: a use after its put
 * is still reported.
 *
 * Thread-local first (a cache made with a .tl id, enum xfer_blk_tl): each
 * thread keeps up to XFER_BLK_TL blocks of each such cache for itself, and
 * only what does not fit there goes through the shared slots. A waiter that
 * reads its own socket allocates and frees a message's blocks on one
 * thread, and the shared slots (and their counters) were then one more set
 * of cache lines passed between the cores of every thread that sends
 * messages: two engines in one process, or several senders (docs/perf.md,
 * "Step 14"). A thread's blocks are freed when it exits (blk_cache.c).
 */
#ifndef XFER_BLK_CACHE_H
#define XFER_BLK_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define BLK_POISON(p, n)   ASAN_POISON_MEMORY_REGION(p, n)
#define BLK_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define BLK_POISON(p, n)   ((void)(p), (void)(n))
#define BLK_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define XFER_BLK_SLOTS 16
#define XFER_BLK_TL    4 /* blocks per thread and cache */

/* The caches with a thread-local part: 1 + their row in xfer_blk_tl. */
enum xfer_blk_tl {
    XFER_BLK_TL_NONE,
    BLK_TL_TX,
    BLK_TL_RX,
    BLK_TL_ENT,
    BLK_TL_RTS,
    BLK_TL_OUT,
    BLK_TL_NOTIF,
    BLK_TL_TEST, /* tests/unit/test_msg_cache.c */
    XFER_BLK_TL_N
};
/* A thread's blocks of one cache: a stack (the block put last is taken
 * first, while its lines are still in this core's cache). */
struct xfer_blk_tl_row {
    unsigned n;
    size_t size; /* the cache's block size, for the release at thread exit */
    void *blk[XFER_BLK_TL];
};
extern __thread struct xfer_blk_tl_row xfer_blk_tl[XFER_BLK_TL_N - 1];
extern __thread bool xfer_blk_tl_kept;
/* Called when a thread keeps its first block: its blocks are freed at its
 * exit. False (keep none) if the system has no thread key to give. */
bool xfer_blk_tl_keep(void);

struct xfer_blk_cache {
    size_t size; /* every block is this large */
    unsigned tl; /* enum xfer_blk_tl: its thread-local row, or none */
    void *slot[XFER_BLK_SLOTS];
    unsigned long hits, misses; /* relaxed counters: tests and measuring */
};

/* The lock-free slots under the cache, also used for other objects kept
 * for reuse (batches, batch.c). Takes any object offered (size bytes, made
 * addressable again), or NULL when every slot is empty. */
static inline void *xfer_slots_take(void **slot, size_t n, size_t size)
{
    for (size_t k = 0; k < n; k++) {
        if (!__atomic_load_n(&slot[k], __ATOMIC_RELAXED))
            continue;
        void *p = __atomic_exchange_n(&slot[k], NULL, __ATOMIC_ACQUIRE);
        if (p) {
            BLK_UNPOISON(p, size);
            return p;
        }
    }
    return NULL;
}

/* Puts p (size bytes, poisoned while it waits) into an empty slot: false
 * when all are full (p is then the caller's again, addressable). */
static inline bool xfer_slots_offer(void **slot, size_t n, void *p, size_t size)
{
    BLK_POISON(p, size);
    for (size_t k = 0; k < n; k++) {
        void *none = NULL;
        if (!__atomic_load_n(&slot[k], __ATOMIC_RELAXED) &&
            __atomic_compare_exchange_n(&slot[k], &none, p, false, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED))
            return true;
    }
    BLK_UNPOISON(p, size);
    return false;
}

/* A block of c->size bytes (uninitialised), cached or malloc'd; NULL when
 * the system is out of memory. */
static inline void *xfer_blk_get(struct xfer_blk_cache *c)
{
    struct xfer_blk_tl_row *own = c->tl ? &xfer_blk_tl[c->tl - 1] : NULL;
    if (own && own->n > 0) {
        void *p = own->blk[--own->n];
        BLK_UNPOISON(p, c->size);
        return p;
    }
    void *p = xfer_slots_take(c->slot, XFER_BLK_SLOTS, c->size);
    __atomic_add_fetch(p ? &c->hits : &c->misses, 1, __ATOMIC_RELAXED);
    return p ? p : malloc(c->size);
}

/* Gives back p (a block of c->size bytes from xfer_blk_get, or NULL). */
static inline void xfer_blk_put(struct xfer_blk_cache *c, void *p)
{
    struct xfer_blk_tl_row *own = p && c->tl ? &xfer_blk_tl[c->tl - 1] : NULL;
    if (own && own->n < XFER_BLK_TL && (xfer_blk_tl_kept || xfer_blk_tl_keep())) {
        BLK_POISON(p, c->size);
        own->size = c->size;
        own->blk[own->n++] = p;
        return;
    }
    if (p && !xfer_slots_offer(c->slot, XFER_BLK_SLOTS, p, c->size))
        free(p);
}

#endif
