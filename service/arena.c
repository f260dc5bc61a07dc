/* Allocations freed together (see arena.h). */
#include "arena.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *arena_push(struct arena *a, void *p, void (*fn)(void *))
{
    if (!p) {
        a->failed = 1;
        return NULL;
    }
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 16;
        struct arena_entry *np = realloc(a->ptrs, cap * sizeof(*np));
        if (!np) {
            fn(p);
            a->failed = 1;
            return NULL;
        }
        a->ptrs = np;
        a->cap = cap;
    }
    a->ptrs[a->n].p = p;
    a->ptrs[a->n++].fn = fn;
    return p;
}

void *arena_adopt(struct arena *a, void *p)
{
    return arena_push(a, p, free);
}

int arena_defer(struct arena *a, void (*fn)(void *), void *p)
{
    return arena_push(a, p, fn) ? 0 : -1;
}

void *arena_alloc(struct arena *a, size_t len)
{
    return arena_adopt(a, calloc(1, len ? len : 1));
}

char *arena_strdup(struct arena *a, const char *s)
{
    return arena_adopt(a, strdup(s ? s : ""));
}

char *arena_printf(struct arena *a, const char *fmt, ...)
{
    va_list ap;
    char *s = NULL;
    va_start(ap, fmt);
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    return arena_adopt(a, n < 0 ? NULL : s);
}

void arena_free(struct arena *a)
{
    for (size_t i = a->n; i-- > 0;)
        a->ptrs[i].fn(a->ptrs[i].p);
    free(a->ptrs);
    memset(a, 0, sizeof(*a));
}
