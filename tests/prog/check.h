/*
 * Shared by the test helper programs: CHECK counts a failed condition and
 * says where, without stopping (a run reports every broken expectation; the
 * program's exit code is `failures != 0`), and a stop flag that SIGTERM and
 * SIGINT set so a serving helper can leave its loop and clean up.
 * Header-only: each helper is one program built from one main file.
 */
#ifndef XFER_TEST_CHECK_H
#define XFER_TEST_CHECK_H

#include <signal.h>
#include <stdio.h>

static int failures;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

static volatile sig_atomic_t stop;
static inline void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

/* SIGTERM and SIGINT end a serving loop through `stop`. */
static inline void catch_stop_signals(void)
{
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
}

#endif
