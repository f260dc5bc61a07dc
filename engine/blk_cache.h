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

struct xfer_blk_cache {
    size_t size; /* every block is this large */
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
    void *p = xfer_slots_take(c->slot, XFER_BLK_SLOTS, c->size);
    __atomic_add_fetch(p ? &c->hits : &c->misses, 1, __ATOMIC_RELAXED);
    return p ? p : malloc(c->size);
}

/* Gives back p (a block of c->size bytes from xfer_blk_get, or NULL). */
static inline void xfer_blk_put(struct xfer_blk_cache *c, void *p)
{
    if (p && !xfer_slots_offer(c->slot, XFER_BLK_SLOTS, p, c->size))
        free(p);
}

#endif
