/*
 * Copy threads for large direct copies (issue 15, docs/ipc.md "Large items"):
 * one memcpy thread does not reach what the host's memory can move, and a
 * large batch copied in the posting thread would make submit as slow as the
 * copy. Items of regions the owner lent (ipc_direct.c) beyond what a post
 * copies itself come here; the transport's threads take them a piece
 * (IPC_DIRECT_PIECE) at a time, so the pieces of one large item run on all
 * threads at once, each under its own pin: a withdrawal waits for one piece.
 *
 * A task is one item. Its pieces are handed out under the pool's lock (one
 * lock per piece of 256 KiB: nothing next to the copy); the thread that
 * finishes a task's last piece ends it: an item whose loan was withdrawn
 * meanwhile goes to the connection's worker, which gets the owner's answer.
 * A task counts a user on its loan entry, so the connection (which waits
 * for its entries' users before it goes) outlives its tasks.
 */
#include "ipc_conn.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define POOL_THREADS_MAX 8
#define POOL_TAKE_MAX    32 /* small tasks one thread takes under one lock */

enum task_state {
    T_OK,
    T_WITHDRAWN, /* a piece found the loan withdrawn: ask the owner */
    T_CLOSED,    /* the connection is closing or broke */
    T_DEAD,      /* the owner hung up before the first piece */
};

struct ipc_task {
    struct ipc_conn *c;
    struct ipc_direct *d;
    xfer_batch *b;
    size_t i;
    uint64_t len, next; /* next: the next piece to hand out (pool lock) */
    int left;           /* pieces not finished (atomic) */
    int state;          /* enum task_state: why pieces stopped (atomic) */
    struct ipc_post *post;
    struct ipc_task *next_task;
};

/* The tasks of one ipc_conn_post (all its windows), freed with the last
 * of them or with its poster's reference, whichever is later. */
struct ipc_post {
    int live;           /* tasks published and not ended, + 1 for the poster (atomic) */
    size_t n, pub, cap; /* tasks added, published, room */
    struct ipc_task t[];
};

/* A parallel loop of ipc_pool_run, on its caller's stack (mu). */
struct ipc_pfor {
    void (*fn)(void *arg, size_t k);
    void *arg;
    size_t n, next, done;
    struct ipc_pfor *next_pfor;
};

struct ipc_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_cond_t pfor_cv;       /* a loop's last part ended */
    struct ipc_pfor *pfor;        /* loops with parts left to hand out */
    struct ipc_task *head, *tail; /* tasks with pieces left to hand out */
    bool stop, started;
    int nthreads;
    pthread_t tid[POOL_THREADS_MAX];
};

static int pool_threads(void)
{
    const char *env = getenv("XFER_IPC_COPY_THREADS");
    long n = env ? atol(env) : sysconf(_SC_NPROCESSORS_ONLN) / 4;
    if (!env && n < 2)
        n = 2; /* with the posting thread: 2x one memcpy even on 2 cores */
    return n < 0 ? 0 : n > POOL_THREADS_MAX ? POOL_THREADS_MAX : (int)n;
}

/* The task's last piece finished: report what the pieces could not. */
static void task_end(struct ipc_task *t)
{
    struct ipc_conn *c = t->c;
    int st = __atomic_load_n(&t->state, __ATOMIC_ACQUIRE);
    if (st == T_DEAD || st == T_CLOSED)
        xfer_batch_chunk_done(t->b, t->i, 0, -XFER_ECONN,
                              st == T_DEAD ? "ipc: the owner closed the connection"
                                           : "ipc connection to the owner closed");
    else if (st == T_WITHDRAWN && xfer_batch_item_live(t->b, t->i))
        ipc_conn_queue(c, t->b, &t->i, 1); /* the owner says why (or copies it) */
    /* c lives while its entry has users: this is the last touch of c. */
    __atomic_sub_fetch(&t->d->users, 1, __ATOMIC_ACQ_REL);
    xfer_batch_put(t->b);
    ipc_post_put(t->post);
}

/* Marks t (the worse reason wins). */
static void task_stop(struct ipc_task *t, int st)
{
    int cur = __atomic_load_n(&t->state, __ATOMIC_RELAXED);
    while (cur < st && !__atomic_compare_exchange_n(&t->state, &cur, st, false, __ATOMIC_ACQ_REL,
                                                    __ATOMIC_RELAXED))
        ;
}

/* polled: the caller just saw the owner still there (one poll for the
 * small items it took together). */
static void piece_run(struct ipc_task *t, uint64_t off, uint64_t len, bool polled)
{
    struct ipc_conn *c = t->c;
    if (off == 0 && !polled && ipc_sock_hung_up(c->fd)) /* a dead owner's memory: a silent loss */
        task_stop(t, T_DEAD);
    if (__atomic_load_n(&c->broken, __ATOMIC_RELAXED) ||
        __atomic_load_n(&c->stop, __ATOMIC_RELAXED))
        task_stop(t, T_CLOSED);
    if (__atomic_load_n(&t->state, __ATOMIC_ACQUIRE) != T_OK)
        return;
    if (ipc_direct_piece(&c->direct, t->d, t->b, t->i, off, len) == 1)
        task_stop(t, T_WITHDRAWN);
}

/* mu held: runs one part of the first loop (mu dropped meanwhile). */
static void pfor_step(struct ipc_pool *p)
{
    struct ipc_pfor *f = p->pfor;
    size_t k = f->next++;
    if (f->next == f->n)
        p->pfor = f->next_pfor;
    pthread_mutex_unlock(&p->mu);
    f->fn(f->arg, k);
    pthread_mutex_lock(&p->mu);
    if (++f->done == f->n) /* f may go as soon as its caller sees this */
        pthread_cond_broadcast(&p->pfor_cv);
}

static void *pool_main(void *arg)
{
    struct ipc_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        if (p->pfor) { /* a worker waits on these: before the tasks */
            pfor_step(p);
            continue;
        }
        struct ipc_task *t = p->head;
        if (!t) {
            pthread_cond_wait(&p->cv, &p->mu);
            continue;
        }
        uint64_t off = t->next;
        uint64_t len = t->len - off < IPC_DIRECT_PIECE ? t->len - off : IPC_DIRECT_PIECE;
        t->next += len;
        if (t->next >= t->len && !(p->head = t->next_task))
            p->tail = NULL;
        /* small whole items behind it come along, up to a piece's bytes:
         * one lock for many small copies, not one each */
        struct ipc_task *more[POOL_TAKE_MAX];
        size_t nmore = 0;
        uint64_t bytes = len;
        for (struct ipc_task *x = p->head;
             off == 0 && len == t->len && x && x->next == 0 && nmore < POOL_TAKE_MAX &&
             x->len <= IPC_DIRECT_PIECE - bytes;
             x = p->head) {
            more[nmore++] = x;
            bytes += x->len;
            x->next = x->len;
            if (!(p->head = x->next_task))
                p->tail = NULL;
        }
        pthread_mutex_unlock(&p->mu);
        piece_run(t, off, len, false);
        bool alive = __atomic_load_n(&t->state, __ATOMIC_ACQUIRE) != T_DEAD;
        struct ipc_conn *tc = t->c; /* t lives in its post, which task_end may free */
        if (__atomic_sub_fetch(&t->left, 1, __ATOMIC_ACQ_REL) == 0)
            task_end(t);
        for (size_t k = 0; k < nmore; k++) {
            piece_run(more[k], 0, more[k]->len, alive && off == 0 && more[k]->c == tc);
            if (__atomic_sub_fetch(&more[k]->left, 1, __ATOMIC_ACQ_REL) == 0)
                task_end(more[k]);
        }
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

struct ipc_pool *ipc_pool_new(void)
{
    int n = pool_threads();
    if (n == 0)
        return NULL;
    struct ipc_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    pthread_cond_init(&p->pfor_cv, NULL);
    p->nthreads = n;
    return p;
}

void ipc_pool_free(struct ipc_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int k = 0; p->started && k < p->nthreads; k++)
        pthread_join(p->tid[k], NULL);
    pthread_cond_destroy(&p->cv);
    pthread_cond_destroy(&p->pfor_cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* p->mu held: the threads start with the first post (most engines never
 * copy a large item). Fewer threads if some cannot start. */
static int pool_start_locked(struct ipc_pool *p)
{
    if (p->started)
        return 0;
    int k = 0;
    while (k < p->nthreads && pthread_create(&p->tid[k], NULL, pool_main, p) == 0)
        k++;
    if (k == 0)
        return -XFER_ENOMEM;
    p->nthreads = k;
    p->started = true;
    return 0;
}

struct ipc_post *ipc_post_new(size_t cap)
{
    struct ipc_post *post = malloc(sizeof(*post) + cap * sizeof(post->t[0]));
    if (post)
        *post = (struct ipc_post){.live = 1, .cap = cap};
    return post;
}

void ipc_post_put(struct ipc_post *post)
{
    if (post && __atomic_sub_fetch(&post->live, 1, __ATOMIC_ACQ_REL) == 0)
        free(post);
}

bool ipc_post_add(struct ipc_post *post, struct ipc_conn *c, xfer_batch *b, size_t i,
                  struct ipc_direct *d)
{
    if (post->n == post->cap)
        return false;
    uint64_t len = xfer_batch_item(b, i)->len;
    int left = len ? (int)((len + IPC_DIRECT_PIECE - 1) / IPC_DIRECT_PIECE) : 1;
    post->t[post->n++] =
        (struct ipc_task){.c = c, .d = d, .b = b, .i = i, .len = len, .left = left, .post = post};
    return true;
}

size_t ipc_post_reclaim(struct ipc_post *post, size_t *idx, struct ipc_direct **d, size_t max)
{
    size_t k = 0;
    for (; post->pub < post->n && k < max; post->pub++, k++) {
        idx[k] = post->t[post->pub].i;
        d[k] = post->t[post->pub].d;
    }
    return k;
}

int ipc_pool_publish(struct ipc_pool *p, struct ipc_post *post)
{
    size_t a = post->pub, n = post->n - a;
    if (n == 0)
        return 0;
    xfer_batch *b = post->t[a].b; /* one batch per post */
    for (size_t k = a; k + 1 < post->n; k++)
        post->t[k].next_task = &post->t[k + 1];
    post->t[post->n - 1].next_task = NULL;
    bool many = n > 1 || post->t[a].left > 1;
    pthread_mutex_lock(&p->mu);
    int rc = p->stop ? -XFER_ECONN : pool_start_locked(p);
    if (rc == 0) {
        xfer_batch_hold_n(b, (int)n); /* one put per task (task_end) */
        __atomic_add_fetch(&post->live, (int)n, __ATOMIC_ACQ_REL);
        if (p->tail)
            p->tail->next_task = &post->t[a];
        else
            p->head = &post->t[a];
        p->tail = &post->t[post->n - 1];
        post->pub = post->n;
        if (many) /* one wake for all the window's tasks */
            pthread_cond_broadcast(&p->cv);
        else
            pthread_cond_signal(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void ipc_pool_run(struct ipc_pool *p, void (*fn)(void *arg, size_t k), void *arg, size_t n)
{
    struct ipc_pfor f = {.fn = fn, .arg = arg, .n = n};
    if (n == 0)
        return;
    pthread_mutex_lock(&p->mu);
    if (n > 1 && !p->stop && pool_start_locked(p) == 0) {
        struct ipc_pfor **at = &p->pfor;
        while (*at)
            at = &(*at)->next_pfor;
        *at = &f;
        pthread_cond_broadcast(&p->cv); /* one wake for the whole loop */
    } else {
        f.next = n; /* no threads: all of it here */
        pthread_mutex_unlock(&p->mu);
        for (size_t k = 0; k < n; k++)
            fn(arg, k);
        return;
    }
    while (f.next < f.n) { /* the caller takes parts too (never only waits) */
        if (p->pfor == &f) {
            pfor_step(p);
            continue;
        }
        struct ipc_pfor **at = &p->pfor; /* another loop is first: take ours out of turn */
        while (*at != &f)
            at = &(*at)->next_pfor;
        size_t k = f.next++;
        if (f.next == f.n)
            *at = f.next_pfor;
        pthread_mutex_unlock(&p->mu);
        fn(arg, k);
        pthread_mutex_lock(&p->mu);
        f.done++;
    }
    while (f.done < f.n)
        pthread_cond_wait(&p->pfor_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
