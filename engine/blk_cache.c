/*
 * The thread-local part of the block caches (blk_cache.h): each thread's
 * blocks, and their release when the thread exits (an application's
 * short-lived threads would otherwise leave up to XFER_BLK_TL blocks of
 * each cache behind).
 */
#include "blk_cache.h"
#include "thread_exit.h"

__thread struct xfer_blk_tl_row xfer_blk_tl[XFER_BLK_TL_N - 1];
__thread bool xfer_blk_tl_kept;

/* At the thread's exit: its blocks go back to the system (poisoned while
 * cached: made addressable first). */
static void tl_release(void)
{
    xfer_blk_tl_kept = false;
    for (int c = 0; c < XFER_BLK_TL_N - 1; c++) {
        struct xfer_blk_tl_row *own = &xfer_blk_tl[c];
        while (own->n > 0) {
            void *p = own->blk[--own->n];
            BLK_UNPOISON(p, own->size);
            free(p);
        }
    }
}

bool xfer_blk_tl_keep(void)
{
    /* Without the exit hook the blocks would outlive the thread: keep none
     * (the caller's put then goes to the shared slots; this runs again). */
    if (xfer_thread_exit_arm(XFER_EXIT_BLK, tl_release))
        xfer_blk_tl_kept = true;
    return xfer_blk_tl_kept;
}
