/* A small string-keyed hash map (chained, power-of-two buckets) used by the
 * registry cache and the publisher state. Keys are copied; values are
 * borrowed pointers the caller owns. Not thread-safe: callers lock. */
#ifndef XFER_REG_STRMAP_H
#define XFER_REG_STRMAP_H

#include <stddef.h>

struct strmap_entry {
    struct strmap_entry *next;
    void *value;
    char key[]; /* NUL-terminated copy */
};

struct strmap {
    struct strmap_entry **buckets;
    size_t nbuckets; /* 0 or a power of two */
    size_t count;
};

void strmap_init(struct strmap *m);
/* Frees the entries; calls free_value on each value when not NULL. */
void strmap_clear(struct strmap *m, void (*free_value)(void *));
void *strmap_get(const struct strmap *m, const char *key);
/* Inserts or replaces. Returns the replaced value (or NULL) in *old when old
 * is not NULL. 0 or -XFER_ENOMEM. */
int strmap_put(struct strmap *m, const char *key, void *value, void **old);
/* Removes key and returns its value (NULL if absent). */
void *strmap_del(struct strmap *m, const char *key);
/* Calls fn(key, value, arg) for every entry; fn must not modify the map. */
void strmap_foreach(const struct strmap *m, void (*fn)(const char *, void *, void *), void *arg);

#endif
