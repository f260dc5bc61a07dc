/*
 * A fuzz target's replay driver for `make test` (gcc, no libFuzzer): runs
 * LLVMFuzzerTestOneInput over every file of the corpus folders given, then
 * over a fixed number of mutations of each (xorshift with a fixed seed:
 * byte flips, inserts, deletes, truncation, splices of two seeds), so the
 * same inputs run every time. Exit 0 when every input returned; a crash or
 * sanitizer report fails the test. An empty or missing corpus is a failure.
 *
 *   replay_NAME [-n MUTATIONS_PER_SEED] DIR...
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REPLAY_MAX 65536
#define MAX_SEEDS  256

struct seed {
    uint8_t *data;
    size_t len;
};

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int load(const char *dir, struct seed *seeds, int *n)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "replay: cannot open corpus %s\n", dir);
        return -1;
    }
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d)) && *n < MAX_SEEDS) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f)
            continue;
        uint8_t *buf = malloc(REPLAY_MAX);
        size_t len = buf ? fread(buf, 1, REPLAY_MAX, f) : 0;
        fclose(f);
        if (!buf)
            break;
        seeds[(*n)++] = (struct seed){buf, len};
    }
    closedir(d);
    return 0;
}

static size_t mutate(const struct seed *s, const struct seed *other, uint8_t *out)
{
    size_t len = s->len;
    memcpy(out, s->data, len);
    int edits = 1 + (int)(next() % 8);
    for (int i = 0; i < edits; i++) {
        size_t pos = len ? next() % len : 0;
        switch (next() % 6) {
        case 0: /* flip a bit */
        case 1:
            if (len)
                out[pos] ^= (uint8_t)(1u << (next() % 8));
            break;
        case 2: /* interesting byte */
            if (len)
                out[pos] = (uint8_t[]){0, 0xff, 0x7f, 0x80, 1, '/', '+', '#'}[next() % 8];
            break;
        case 3: /* insert */
            if (len < REPLAY_MAX) {
                memmove(out + pos + 1, out + pos, len - pos);
                out[pos] = (uint8_t)next();
                len++;
            }
            break;
        case 4: /* delete or truncate */
            if (len) {
                if (next() % 2) {
                    memmove(out + pos, out + pos + 1, len - pos - 1);
                    len--;
                } else {
                    len = pos;
                }
            }
            break;
        case 5: { /* splice the other seed's tail */
            size_t from = other->len ? next() % other->len : 0;
            size_t take = other->len - from;
            if (pos + take > REPLAY_MAX)
                take = REPLAY_MAX - pos;
            memcpy(out + pos, other->data + from, take);
            len = pos + take;
            break;
        }
        }
    }
    return len;
}

int main(int argc, char **argv)
{
    long per_seed = 500;
    int i = 1, n = 0;
    if (argc > 2 && !strcmp(argv[1], "-n")) {
        per_seed = atol(argv[2]);
        i = 3;
    }
    static struct seed seeds[MAX_SEEDS];
    for (; i < argc; i++)
        if (load(argv[i], seeds, &n))
            return 2;
    if (n == 0) {
        fprintf(stderr, "replay: no seed inputs (empty corpus)\n");
        return 2;
    }
    static uint8_t buf[REPLAY_MAX];
    long runs = 0;
    for (int s = 0; s < n; s++) {
        LLVMFuzzerTestOneInput(seeds[s].data, seeds[s].len);
        runs++;
        for (long m = 0; m < per_seed; m++) {
            size_t len = mutate(&seeds[s], &seeds[next() % (uint64_t)n], buf);
            uint8_t *exact = malloc(len ? len : 1); /* exact size for ASan */
            if (!exact)
                return 2;
            memcpy(exact, buf, len);
            LLVMFuzzerTestOneInput(exact, len);
            free(exact);
            runs++;
        }
    }
    printf("replay: %d seeds, %ld inputs, all returned\n", n, runs);
    for (int s = 0; s < n; s++)
        free(seeds[s].data);
    return 0;
}
