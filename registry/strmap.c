/* String-keyed chained hash map for the registry cache (see strmap.h). */
#include "strmap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "xfer.h"

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

void strmap_init(struct strmap *m)
{
    memset(m, 0, sizeof(*m));
}

void strmap_clear(struct strmap *m, void (*free_value)(void *))
{
    for (size_t i = 0; i < m->nbuckets; i++) {
        struct strmap_entry *e = m->buckets[i];
        while (e) {
            struct strmap_entry *next = e->next;
            if (free_value)
                free_value(e->value);
            free(e);
            e = next;
        }
    }
    free(m->buckets);
    strmap_init(m);
}

static struct strmap_entry **slot_of(const struct strmap *m, const char *key)
{
    struct strmap_entry **p = &m->buckets[hash_str(key) & (m->nbuckets - 1)];
    while (*p && strcmp((*p)->key, key))
        p = &(*p)->next;
    return p;
}

void *strmap_get(const struct strmap *m, const char *key)
{
    if (!m->nbuckets)
        return NULL;
    struct strmap_entry *e = *slot_of(m, key);
    return e ? e->value : NULL;
}

/* Doubles the bucket array once the load factor passes 1. */
static int grow(struct strmap *m)
{
    size_t n = m->nbuckets ? m->nbuckets * 2 : 16;
    struct strmap_entry **b = calloc(n, sizeof(*b));
    if (!b)
        return -XFER_ENOMEM;
    for (size_t i = 0; i < m->nbuckets; i++) {
        struct strmap_entry *e = m->buckets[i];
        while (e) {
            struct strmap_entry *next = e->next;
            size_t j = hash_str(e->key) & (n - 1);
            e->next = b[j];
            b[j] = e;
            e = next;
        }
    }
    free(m->buckets);
    m->buckets = b;
    m->nbuckets = n;
    return 0;
}

int strmap_put(struct strmap *m, const char *key, void *value, void **old)
{
    if (old)
        *old = NULL;
    if (m->count >= m->nbuckets && grow(m))
        return -XFER_ENOMEM;
    struct strmap_entry **p = slot_of(m, key);
    if (*p) {
        if (old)
            *old = (*p)->value;
        (*p)->value = value;
        return 0;
    }
    size_t len = strlen(key) + 1;
    struct strmap_entry *e = malloc(sizeof(*e) + len);
    if (!e)
        return -XFER_ENOMEM;
    memcpy(e->key, key, len);
    e->value = value;
    e->next = NULL;
    *p = e;
    m->count++;
    return 0;
}

void *strmap_del(struct strmap *m, const char *key)
{
    if (!m->nbuckets)
        return NULL;
    struct strmap_entry **p = slot_of(m, key);
    struct strmap_entry *e = *p;
    if (!e)
        return NULL;
    void *v = e->value;
    *p = e->next;
    free(e);
    m->count--;
    return v;
}

void strmap_foreach(const struct strmap *m, void (*fn)(const char *, void *, void *), void *arg)
{
    for (size_t i = 0; i < m->nbuckets; i++)
        for (struct strmap_entry *e = m->buckets[i]; e; e = e->next)
            fn(e->key, e->value, arg);
}
