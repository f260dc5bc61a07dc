/*
 * Work done for a thread when it exits: the block caches' rows
 * (blk_cache.c), the counter shard it owns (stats.c), its waiter eventfd
 * (batch_wait.c). One pthread key serves them all; each part arms its
 * hook for the calling thread once, and the key's destructor runs the
 * hooks that thread armed, on that thread (its thread-locals still there).
 * When libxfer.so is unloaded (dlclose) the key is deleted, so a thread
 * that outlives the library does not call into unmapped code at its exit
 * (what it kept is left behind, as anything an unloaded library allocated
 * is): tests/unit/test_dlclose.c.
 */
#ifndef XFER_THREAD_EXIT_H
#define XFER_THREAD_EXIT_H

#include <stdbool.h>

enum xfer_exit_hook {
    XFER_EXIT_BLK,   /* blk_cache.c: the thread's cached blocks */
    XFER_EXIT_STATS, /* stats.c: the counter shard it owns */
    XFER_EXIT_WAKER, /* batch_wait.c: its waiter eventfd */
    XFER_EXIT_HOOKS
};

/* Runs release at this thread's exit (once; armed again after it ran, it
 * runs again). false: it will not run (no key: none could be made, or the
 * library is being unloaded); the caller keeps nothing that needs it. */
bool xfer_thread_exit_arm(enum xfer_exit_hook which, void (*release)(void));

#endif
