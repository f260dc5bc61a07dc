/* One thread-exit key for the engine's thread-local parts (thread_exit.h). */
#include "thread_exit.h"

#include <pthread.h>

static pthread_key_t key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
/* Atomic: the unload destructor clears it while another thread may read it
 * (process exit); pthread_setspecific on the deleted key then fails (EINVAL). */
static bool key_ok;
/* Atomic: a part stores its hook before it arms (the same value each time). */
static void (*hooks[XFER_EXIT_HOOKS])(void);
static __thread unsigned armed; /* bit per hook this thread armed */

/* At the thread's exit (the key's value is only a marker). A hook that
 * arms again (a count after the shard went back) sets the value again,
 * and the key's destructor runs once more (PTHREAD_DESTRUCTOR_ITERATIONS). */
static void run_hooks(void *marker)
{
    (void)marker;
    unsigned a = armed;
    armed = 0;
    for (int k = 0; k < XFER_EXIT_HOOKS; k++)
        if (a & 1u << k)
            __atomic_load_n(&hooks[k], __ATOMIC_RELAXED)();
}

static void key_init(void)
{
    __atomic_store_n(&key_ok, pthread_key_create(&key, run_hooks) == 0, __ATOMIC_RELAXED);
}

/* libxfer.so unloaded while threads that armed hooks still run: the key
 * goes with it, so no such thread's exit runs them in unmapped code. Also
 * at a normal exit, where it changes nothing. */
__attribute__((destructor)) static void key_unload(void)
{
    if (__atomic_exchange_n(&key_ok, false, __ATOMIC_RELAXED))
        pthread_key_delete(key);
}

bool xfer_thread_exit_arm(enum xfer_exit_hook which, void (*release)(void))
{
    unsigned bit = 1u << which;
    if (armed & bit)
        return true;
    pthread_once(&key_once, key_init);
    if (!__atomic_load_n(&key_ok, __ATOMIC_RELAXED))
        return false;
    __atomic_store_n(&hooks[which], release, __ATOMIC_RELAXED);
    if (!armed && pthread_setspecific(key, (void *)1) != 0)
        return false;
    armed |= bit;
    return true;
}
