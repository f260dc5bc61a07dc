/*
 * Shared by the GPU request ring tests (tests/prog/xfer_ring_node.c, CPU
 * producers; tests/gpu/gpu_ring.c, kernels): the receiving process checks
 * the bytes itself. The sender writes NODEFILE.verify ("SEED LEN"); the
 * receiver's loop compares [0, LEN) of its region "dst" with
 * pattern_fill(SEED, base 0) and answers NODEFILE.result ("ok" or "bad AT").
 * Header-only, like node_common.h.
 */
#ifndef XFER_TEST_RING_COMMON_H
#define XFER_TEST_RING_COMMON_H

#include "node_common.h"

#include <signal.h>

/* Reads len bytes at off of the receiver's region into dst (host memory,
 * or a device-to-host copy); 0 or -1. */
typedef int (*ring_read_fn)(void *ctx, uint64_t off, void *dst, uint64_t len);

static inline void ring_file_put(const char *path, const char *text)
{
    char tmp[700];
    snprintf(tmp, sizeof(tmp), "%.600s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return;
    fputs(text, f);
    fclose(f);
    rename(tmp, path);
}

/* Compares [0, len) of the receiver's region (through read) with
 * pattern_fill(seed, base 0): UINT64_MAX when equal, else the first
 * differing offset (or where reading failed). */
static inline uint64_t ring_check_pattern(ring_read_fn read, void *ctx, uint64_t seed, uint64_t len)
{
    const uint64_t step = 4u << 20;
    uint8_t *have = malloc(step), *want = malloc(step);
    uint64_t bad_at = have && want ? UINT64_MAX : 0;
    for (uint64_t off = 0; bad_at == UINT64_MAX && off < len; off += step) {
        uint64_t n = len - off < step ? len - off : step;
        if (read(ctx, off, have, n) < 0) {
            bad_at = off;
            break;
        }
        pattern_fill(want, n, seed, off);
        for (uint64_t i = 0; i < n; i++)
            if (have[i] != want[i]) {
                bad_at = off + i;
                break;
            }
    }
    free(have);
    free(want);
    return bad_at;
}

/* Answers one pending verification request, if any; true if it did. */
static inline bool ring_peer_verify_once(const char *node_file, ring_read_fn read, void *ctx,
                                         uint64_t region_len)
{
    char req[600], res[600], line[128];
    snprintf(req, sizeof(req), "%s.verify", node_file);
    snprintf(res, sizeof(res), "%s.result", node_file);
    FILE *f = fopen(req, "r");
    if (!f)
        return false;
    unsigned long long seed = 0, len = 0;
    int got = fscanf(f, "%llu %llu", &seed, &len);
    fclose(f);
    unlink(req);
    if (got != 2 || len > region_len) {
        ring_file_put(res, "bad request\n");
        return true;
    }
    uint64_t bad_at = ring_check_pattern(read, ctx, seed, len);
    if (bad_at == UINT64_MAX)
        snprintf(line, sizeof(line), "ok %llu bytes\n", len);
    else
        snprintf(line, sizeof(line), "bad at %llu\n", (unsigned long long)bad_at);
    ring_file_put(res, line);
    return true;
}

/* The receiver: answers verification requests until *stop (at most 10
 * minutes), polling for them every 10 ms. */
static inline void ring_peer_loop(const char *node_file, ring_read_fn read, void *ctx,
                                  uint64_t region_len, volatile sig_atomic_t *stop)
{
    for (int i = 0; !*stop && i < 60000; i++)
        if (!ring_peer_verify_once(node_file, read, ctx, region_len))
            usleep(10000);
}

/* The sender: asks the receiver to check [0, len) against seed; 0 when it
 * says ok within timeout_s, else -1 with its answer printed. */
static inline int ring_verify(const char *node_file, uint64_t seed, uint64_t len, double timeout_s)
{
    char req[600], res[600], text[64], answer[128] = "no answer";
    snprintf(req, sizeof(req), "%s.verify", node_file);
    snprintf(res, sizeof(res), "%s.result", node_file);
    unlink(res);
    snprintf(text, sizeof(text), "%llu %llu\n", (unsigned long long)seed, (unsigned long long)len);
    ring_file_put(req, text);
    for (double t0 = now_s(); now_s() - t0 < timeout_s; usleep(10000)) {
        FILE *f = fopen(res, "r");
        if (!f)
            continue;
        if (!fgets(answer, sizeof(answer), f))
            answer[0] = '\0';
        fclose(f);
        unlink(res);
        break;
    }
    answer[strcspn(answer, "\n")] = '\0';
    printf("  receiver checked %llu bytes: %s\n", (unsigned long long)len, answer);
    return strncmp(answer, "ok", 2) == 0 ? 0 : -1;
}

#endif
