/* Async batches: ids handed out at submit, results kept for QueryStatus.
 * A ring of the newest BATCH_KEEP batches; older ids are forgotten. */
#include "xferd.h"

#include <stdlib.h>
#include <string.h>

#define BATCH_KEEP 1024

struct stored_item {
    int32_t status;
    char *message, *executor;
    uint64_t elapsed_us, bytes;
};

struct stored_batch {
    uint64_t id; /* 0 = empty slot */
    bool done;
    size_t n;
    struct stored_item *items;
};

struct batch_table {
    pthread_mutex_t lock;
    uint64_t next_id;
    struct stored_batch slots[BATCH_KEEP];
};

static void slot_clear(struct stored_batch *s)
{
    for (size_t i = 0; s->items && i < s->n; i++) {
        free(s->items[i].message);
        free(s->items[i].executor);
    }
    free(s->items);
    memset(s, 0, sizeof(*s));
}

struct batch_table *batch_table_new(void)
{
    struct batch_table *t = calloc(1, sizeof(*t));
    if (t) {
        pthread_mutex_init(&t->lock, NULL);
        t->next_id = 1;
    }
    return t;
}

void batch_table_free(struct batch_table *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < BATCH_KEEP; i++)
        slot_clear(&t->slots[i]);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

uint64_t batch_table_add(struct batch_table *t, size_t nitems)
{
    pthread_mutex_lock(&t->lock);
    uint64_t id = t->next_id++;
    struct stored_batch *s = &t->slots[id % BATCH_KEEP];
    slot_clear(s);
    s->id = id;
    s->n = nitems;
    pthread_mutex_unlock(&t->lock);
    return id;
}

void batch_table_finish(struct batch_table *t, uint64_t id, Xctl__ItemResult *const *items,
                        size_t n)
{
    struct stored_item *copy = calloc(n ? n : 1, sizeof(*copy));
    for (size_t i = 0; copy && i < n; i++) {
        copy[i].status = items[i]->status;
        copy[i].message = strdup(items[i]->message ? items[i]->message : "");
        copy[i].executor = strdup(items[i]->executor ? items[i]->executor : "");
        copy[i].elapsed_us = items[i]->elapsed_us;
        copy[i].bytes = items[i]->bytes;
    }
    pthread_mutex_lock(&t->lock);
    struct stored_batch *s = &t->slots[id % BATCH_KEEP];
    if (s->id == id && copy) {
        s->items = copy;
        s->n = n;
        copy = NULL;
    }
    s->done = s->id == id;
    pthread_mutex_unlock(&t->lock);
    if (copy) { /* slot reused meanwhile, or a copy failed */
        struct stored_batch tmp = {.items = copy, .n = n};
        slot_clear(&tmp);
    }
}

int batch_table_query(struct batch_table *t, uint64_t id, Xctl__BatchResult *res, struct arena *a)
{
    pthread_mutex_lock(&t->lock);
    struct stored_batch *s = &t->slots[id % BATCH_KEEP];
    if (id == 0 || s->id != id) {
        pthread_mutex_unlock(&t->lock);
        return -XFER_ENOENT;
    }
    res->batch_id = id;
    res->done = s->done;
    if (s->done && s->items) {
        res->items = arena_alloc(a, s->n * sizeof(*res->items));
        for (size_t i = 0; res->items && i < s->n; i++) {
            Xctl__ItemResult *m = arena_alloc(a, sizeof(*m));
            if (!m)
                break;
            xctl__item_result__init(m);
            m->status = s->items[i].status;
            m->message = arena_strdup(a, s->items[i].message);
            m->executor = arena_strdup(a, s->items[i].executor);
            m->elapsed_us = s->items[i].elapsed_us;
            m->bytes = s->items[i].bytes;
            res->items[res->n_items++] = m;
        }
    }
    pthread_mutex_unlock(&t->lock);
    return 0;
}
