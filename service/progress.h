/* A one-line progress bar on stderr for long put/get; drawn only when
 * stderr is a terminal, at most 10 times a second. */
#ifndef XFER_SERVICE_PROGRESS_H
#define XFER_SERVICE_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

struct progress {
    const char *label;
    uint64_t total, done;
    int64_t start_ms, drawn_ms;
    bool on;
};

/* Enabled when stderr is a tty and total >= min_bytes. */
void progress_start(struct progress *p, const char *label, uint64_t total, uint64_t min_bytes);
void progress_add(struct progress *p, uint64_t bytes);
/* Final draw and newline (nothing when disabled). */
void progress_end(struct progress *p);
/* "1.5 GiB", "12.0 MiB/s"-style human sizes into buf. */
const char *human_bytes(double v, char *buf, int len);

#endif
