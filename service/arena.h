/* A bag of allocations freed together: the nested protobuf structs of one
 * response live in the request's arena until the response is sent. */
#ifndef XFER_SERVICE_ARENA_H
#define XFER_SERVICE_ARENA_H

#include <stddef.h>

struct arena_entry {
    void *p;
    void (*fn)(void *);
};

struct arena {
    struct arena_entry *ptrs;
    size_t n, cap;
    int failed; /* an allocation failed; callers check once at the end */
};

/* Zeroed memory owned by a; NULL (and a->failed) when out of memory. */
void *arena_alloc(struct arena *a, size_t len);
char *arena_strdup(struct arena *a, const char *s);
char *arena_printf(struct arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Takes ownership of p (malloc'd); frees it at once when out of memory. */
void *arena_adopt(struct arena *a, void *p);
/* Calls fn(p) when the arena is freed (at once, returning -1, when out of
 * memory). Entries are released newest first. */
int arena_defer(struct arena *a, void (*fn)(void *), void *p);
void arena_free(struct arena *a);

#endif
