/*
 * The engine's interval clock. Every timed wait measures CLOCK_MONOTONIC,
 * so a step of the wall clock (NTP, an operator, a resumed VM) neither
 * stretches a wait (a step back would make a CLOCK_REALTIME deadline hours
 * away) nor ends it early (a step forward). The wall clock is for log lines
 * and published timestamps only. Shared by the core and the transports.
 */
#ifndef XFER_MONO_CLOCK_H
#define XFER_MONO_CLOCK_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

/* pthread_cond_init with pthread_condattr_setclock(CLOCK_MONOTONIC). */
void xfer_cond_init_mono(pthread_cond_t *cv);
/* CLOCK_MONOTONIC in nanoseconds: the one reading every interval of the
 * engine, the transports and the node library goes through (milliseconds:
 * xfer_now_ms, xfer_io.h). */
static inline int64_t xfer_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
/* CLOCK_MONOTONIC in microseconds (debug timings, short deadlines). */
static inline int64_t xfer_mono_us(void)
{
    return xfer_mono_ns() / 1000;
}

/* The absolute CLOCK_MONOTONIC time ns from now (ns <= 0: now), for
 * pthread_cond_timedwait on a condition made by xfer_cond_init_mono. */
struct timespec xfer_mono_after_ns(int64_t ns);
static inline struct timespec xfer_mono_after_ms(int64_t ms)
{
    return xfer_mono_after_ns(ms * 1000000);
}
/* The CLOCK_MONOTONIC time ns (an xfer_mono_ns value, >= 0) as such an
 * absolute timespec: a wait that ends at an instant already computed, with
 * no clock read. */
static inline struct timespec xfer_mono_at_ns(int64_t ns)
{
    return (struct timespec){(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
}

#endif
