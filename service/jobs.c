/* Worker pool: jobs run on workers, their done callbacks on the loop thread
 * (woken through an eventfd), so control I/O never waits on a transfer. */
#include "xferd.h"

#include <event2/event.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct jobq {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct job *todo, **todo_tail;
    struct job *done, **done_tail;
    int pending; /* queued + running + awaiting done */
    bool stopping;
    int nworkers;
    pthread_t *workers;
    int efd;
    struct event *ev;
};

static void *worker_main(void *arg)
{
    struct jobq *q = arg;
    for (;;) {
        pthread_mutex_lock(&q->lock);
        while (!q->todo && !q->stopping)
            pthread_cond_wait(&q->cond, &q->lock);
        struct job *j = q->todo;
        if (!j) {
            pthread_mutex_unlock(&q->lock);
            return NULL;
        }
        q->todo = j->next;
        if (!q->todo)
            q->todo_tail = &q->todo;
        pthread_mutex_unlock(&q->lock);

        j->run(j);

        pthread_mutex_lock(&q->lock);
        j->next = NULL;
        *q->done_tail = j;
        q->done_tail = &j->next;
        pthread_mutex_unlock(&q->lock);
        uint64_t one = 1;
        ssize_t w = write(q->efd, &one, sizeof(one));
        (void)w; /* counter overflow is impossible at this rate */
    }
}

static void run_done(struct jobq *q)
{
    pthread_mutex_lock(&q->lock);
    struct job *j = q->done;
    q->done = NULL;
    q->done_tail = &q->done;
    pthread_mutex_unlock(&q->lock);
    while (j) {
        struct job *next = j->next;
        pthread_mutex_lock(&q->lock);
        q->pending--;
        pthread_mutex_unlock(&q->lock);
        j->done(j);
        j = next;
    }
}

static void on_efd(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    uint64_t v;
    ssize_t r = read(fd, &v, sizeof(v));
    (void)r;
    run_done(arg);
}

struct jobq *jobq_new(struct event_base *base, int workers)
{
    struct jobq *q = calloc(1, sizeof(*q));
    if (!q)
        return NULL;
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->cond, NULL);
    q->todo_tail = &q->todo;
    q->done_tail = &q->done;
    q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    q->workers = calloc((size_t)workers, sizeof(pthread_t));
    if (q->efd < 0 || !q->workers)
        goto fail;
    q->ev = event_new(base, q->efd, EV_READ | EV_PERSIST, on_efd, q);
    if (!q->ev || event_add(q->ev, NULL))
        goto fail;
    for (; q->nworkers < workers; q->nworkers++)
        if (pthread_create(&q->workers[q->nworkers], NULL, worker_main, q))
            goto fail;
    return q;
fail:
    jobq_free(q);
    return NULL;
}

int jobq_push(struct jobq *q, struct job *j)
{
    pthread_mutex_lock(&q->lock);
    if (q->stopping) {
        pthread_mutex_unlock(&q->lock);
        return -XFER_EBUSY;
    }
    j->next = NULL;
    *q->todo_tail = j;
    q->todo_tail = &j->next;
    q->pending++;
    pthread_cond_signal(&q->cond);
    pthread_mutex_unlock(&q->lock);
    return 0;
}

int jobq_pending(struct jobq *q)
{
    pthread_mutex_lock(&q->lock);
    int n = q->pending;
    pthread_mutex_unlock(&q->lock);
    return n;
}

void jobq_free(struct jobq *q)
{
    if (!q)
        return;
    pthread_mutex_lock(&q->lock);
    q->stopping = true; /* workers finish the queue, then exit */
    pthread_cond_broadcast(&q->cond);
    pthread_mutex_unlock(&q->lock);
    for (int i = 0; i < q->nworkers; i++)
        pthread_join(q->workers[i], NULL);
    run_done(q);
    if (q->ev)
        event_free(q->ev);
    if (q->efd >= 0)
        close(q->efd);
    pthread_cond_destroy(&q->cond);
    pthread_mutex_destroy(&q->lock);
    free(q->workers);
    free(q);
}
