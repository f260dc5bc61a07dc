/*
 * libslowsend.so: an LD_PRELOAD shim that delays this process's sendmsg
 * calls once armed, for tests of what happens while an answer is on its
 * way (tests/integration/test_notify.sh, "closing right after a
 * notification"). Test builds only.
 *
 * The program under test arms it when the moment comes:
 *   void (*arm)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "xfer_slowsend_arm");
 *   arm(ms);   every sendmsg from then on sleeps ms first (0: no more)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/socket.h>
#include <time.h>

static int delay_ms; /* atomic */

__attribute__((visibility("default"))) void xfer_slowsend_arm(int ms)
{
    __atomic_store_n(&delay_ms, ms, __ATOMIC_RELEASE);
}

__attribute__((visibility("default"))) ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
    static ssize_t (*real)(int, const struct msghdr *, int);
    if (!real)
        real = (ssize_t(*)(int, const struct msghdr *, int))dlsym(RTLD_NEXT, "sendmsg");
    int ms = __atomic_load_n(&delay_ms, __ATOMIC_ACQUIRE);
    if (ms > 0) {
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
        nanosleep(&ts, NULL);
    }
    return real(fd, m, flags);
}
