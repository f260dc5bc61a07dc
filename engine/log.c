/* Logging: one level, one settable sink, lines written whole. */
#include "xfer.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static int log_level = -1; /* -1: not yet read from XFER_LOG_LEVEL */
static xfer_log_fn log_fn;
static void *log_arg;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

static void log_init_from_env(void)
{
    const char *s = getenv("XFER_LOG_LEVEL");
    int lvl = XFER_LOG_WARN;
    for (int i = 0; s && i <= XFER_LOG_DEBUG; i++)
        if (!strcasecmp(s, level_names[i]))
            lvl = i;
    if (__atomic_load_n(&log_level, __ATOMIC_RELAXED) < 0)
        __atomic_store_n(&log_level, lvl, __ATOMIC_RELAXED);
}

enum xfer_log_level xfer_log_get_level(void)
{
    int lvl = __atomic_load_n(&log_level, __ATOMIC_RELAXED);
    if (lvl < 0) {
        pthread_once(&log_once, log_init_from_env);
        lvl = __atomic_load_n(&log_level, __ATOMIC_RELAXED);
    }
    return (enum xfer_log_level)lvl;
}

void xfer_log_set_level(enum xfer_log_level lvl)
{
    __atomic_store_n(&log_level, (int)lvl, __ATOMIC_RELAXED);
}

void xfer_log_set_handler(xfer_log_fn fn, void *arg)
{
    log_arg = arg;
    log_fn = fn;
}

void xfer_log_write(enum xfer_log_level lvl, const char *file, int line, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (log_fn) {
        log_fn(lvl, msg, log_arg);
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    const char *base = strrchr(file, '/');
    char out[1200];
    int n = snprintf(out, sizeof(out), "%02d:%02d:%02d.%03ld %-5s [%d] %s:%d: %s\n", tm.tm_hour,
                     tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, level_names[lvl], (int)getpid(),
                     base ? base + 1 : file, line, msg);
    if (n > (int)sizeof(out) - 1)
        n = (int)sizeof(out) - 1;
    /* One write() so that lines of concurrent threads do not interleave. */
    ssize_t w = write(STDERR_FILENO, out, (size_t)n);
    (void)w;
}
