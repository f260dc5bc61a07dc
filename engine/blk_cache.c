/*
 * The thread-local part of the block caches (blk_cache.h): each thread's
 * blocks, and their release when the thread exits (an application's
 * short-lived threads would otherwise leave up to XFER_BLK_TL blocks of
 * each cache behind).
 */
#include "blk_cache.h"

#include <pthread.h>

__thread struct xfer_blk_tl_row xfer_blk_tl[XFER_BLK_TL_N - 1];
__thread bool xfer_blk_tl_kept;

static pthread_key_t tl_key;
static pthread_once_t tl_once = PTHREAD_ONCE_INIT;
/* Atomic: the unload destructor clears it while another thread may read it
 * (process exit); pthread_setspecific on the deleted key then fails (EINVAL). */
static bool tl_key_ok;

/* At the thread's exit (the key's value is only a marker): its blocks go
 * back to the system (poisoned while cached: made addressable first). */
static void tl_release(void *marker)
{
    (void)marker;
    for (int c = 0; c < XFER_BLK_TL_N - 1; c++) {
        struct xfer_blk_tl_row *own = &xfer_blk_tl[c];
        while (own->n > 0) {
            void *p = own->blk[--own->n];
            BLK_UNPOISON(p, own->size);
            free(p);
        }
    }
}

static void tl_init(void)
{
    bool ok = pthread_key_create(&tl_key, tl_release) == 0;
    __atomic_store_n(&tl_key_ok, ok, __ATOMIC_RELAXED);
}

/* libxfer.so unloaded (dlclose) while threads that kept blocks still run:
 * the key goes with it, so no such thread's exit calls tl_release in
 * unmapped code (their blocks are left behind, as anything an unloaded
 * library allocated is). Also at a normal exit, where it changes nothing. */
__attribute__((destructor)) static void tl_unload(void)
{
    if (__atomic_exchange_n(&tl_key_ok, false, __ATOMIC_RELAXED))
        pthread_key_delete(tl_key);
}

bool xfer_blk_tl_keep(void)
{
    pthread_once(&tl_once, tl_init);
    /* Without a key the blocks would outlive the thread: keep none (the
     * caller's put then goes to the shared slots; this runs again). */
    if (__atomic_load_n(&tl_key_ok, __ATOMIC_RELAXED) &&
        pthread_setspecific(tl_key, (void *)1) == 0)
        xfer_blk_tl_kept = true;
    return xfer_blk_tl_kept;
}
