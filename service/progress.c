/* Progress bar for xferctl put/get. */
#include "progress.h"
#include "xfer_io.h"

#include <stdio.h>
#include <unistd.h>

const char *human_bytes(double v, char *buf, int len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, (size_t)len, u ? "%.1f %s" : "%.0f %s", v, units[u]);
    return buf;
}

void progress_start(struct progress *p, const char *label, uint64_t total, uint64_t min_bytes)
{
    p->label = label;
    p->total = total;
    p->done = 0;
    p->start_ms = p->drawn_ms = xfer_now_ms();
    p->on = total >= min_bytes && isatty(STDERR_FILENO);
}

static void draw(struct progress *p)
{
    const int width = 30;
    double frac = p->total ? (double)p->done / (double)p->total : 1.0;
    int fill = (int)(frac * width);
    double secs = (double)(xfer_now_ms() - p->start_ms) / 1000.0;
    char bar[64], done[32], rate[32];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '-';
    bar[width] = 0;
    human_bytes((double)p->done, done, sizeof(done));
    human_bytes(secs > 0 ? (double)p->done / secs : 0, rate, sizeof(rate));
    fprintf(stderr, "\r%s [%s] %3.0f%% %s %s/s ", p->label, bar, frac * 100, done, rate);
    fflush(stderr);
}

void progress_add(struct progress *p, uint64_t bytes)
{
    p->done += bytes;
    if (!p->on)
        return;
    int64_t now = xfer_now_ms();
    if (now - p->drawn_ms >= 100) {
        p->drawn_ms = now;
        draw(p);
    }
}

void progress_end(struct progress *p)
{
    if (!p->on)
        return;
    draw(p);
    fputc('\n', stderr);
}
