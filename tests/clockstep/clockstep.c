/*
 * libclockstep.so: an LD_PRELOAD shim that steps this process's wall clock,
 * for tests of what a clock step (NTP, an operator, a resumed VM) does to a
 * program. Test builds only; the kernel's own clocks are not touched.
 *
 *   XFER_CLOCK_STEP=SECONDS[@AFTER_MS]
 *
 * From AFTER_MS (default 0) after the shim loads, CLOCK_REALTIME as read
 * through clock_gettime, gettimeofday and time is SECONDS off (negative:
 * back). CLOCK_MONOTONIC is left alone, as a real step leaves it. The kernel
 * still measures a CLOCK_REALTIME condition-variable deadline on the real
 * clock, so a deadline computed from the stepped clock lies SECONDS away
 * from where the program meant it: exactly a step taken between computing
 * the deadline and waiting on it.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int64_t step_ns, from_ns; /* from_ns: CLOCK_MONOTONIC at which the step applies */

static int64_t ts_ns(const struct timespec *ts)
{
    return (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec;
}

/* The real clocks, bypassing any interposed symbol (and the vDSO). */
static int real_gettime(clockid_t id, struct timespec *ts)
{
    return (int)syscall(SYS_clock_gettime, id, ts);
}

__attribute__((constructor)) static void clockstep_init(void)
{
    const char *v = getenv("XFER_CLOCK_STEP");
    if (!v || !*v)
        return;
    char *end;
    step_ns = strtoll(v, &end, 10) * 1000000000;
    int64_t after_ms = *end == '@' ? strtoll(end + 1, NULL, 10) : 0;
    struct timespec now;
    real_gettime(CLOCK_MONOTONIC, &now);
    from_ns = ts_ns(&now) + after_ms * 1000000;
}

static int64_t offset_ns(void)
{
    if (!step_ns)
        return 0;
    struct timespec now;
    real_gettime(CLOCK_MONOTONIC, &now);
    return ts_ns(&now) >= from_ns ? step_ns : 0;
}

int clock_gettime(clockid_t id, struct timespec *ts)
{
    int rc = real_gettime(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        int64_t ns = ts_ns(ts) + offset_ns();
        ts->tv_sec = (time_t)(ns / 1000000000);
        ts->tv_nsec = (long)(ns % 1000000000);
    }
    return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz)
{
    (void)tz;
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *out)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
