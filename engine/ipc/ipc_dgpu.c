/*
 * GPU loans (docs/ipc.md "GPU loans"): items between GPU memory here and
 * a CUDA region the owner lent us (block items as block runs, plain and
 * vectored ones as segment runs or copy-engine copies) are launched by the
 * thread that posts them, with no hand-off to the ipc worker and no
 * ACQV/REL round trip to the owner, and reported by the connection's loan
 * poller, a thread that queries the launches' events back to back while
 * any is in flight (and sleeps otherwise). The owner keeps control as for
 * direct host copies (ipc_direct.c): each item holds a pin
 * on the loan's control slot from before its launch until its kernel has
 * finished, taken before the slot's key is read, so a withdrawal (a
 * deregistration, a lease rule on the region) waits for launches in
 * flight and no launch starts after it. Regions with lease rules are never
 * lent: their transfers go through the owner, which refuses released or
 * expired blocks (-XFER_ESTALE, naming them).
 */
#include "ipc_conn.h"
#include "xfer_kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

struct dgpu_item {
    xfer_batch *b;
    size_t i;
    struct ipc_direct *d;
    uint64_t bytes;
};

/* A launch's times (XFER_DGPU_TRACE=1; CLOCK_MONOTONIC ns): the post
 * entered, the launch began and returned, the poller saw its end and had
 * reported it; gpu_us: on the GPU (XFER_KBATCH_TRACE=1, else -1). */
struct dgpu_tr {
    uint64_t post, go, launched, seen, reported;
    double gpu_us;
    size_t n;
    char kind; /* 'b' block runs, 's' segment runs / copy-engine copies */
};

/* One launch: its ticket and what its completion reports. */
struct dgpu_launch {
    struct ipc_ctl_slot *ctl;
    int ticket;
    struct dgpu_tr tr;
    struct dgpu_launch *next;
    size_t n;
    struct dgpu_item it[];
};

/* A connection's loan launches (c->dgpu, all under c->dkb_mu). */
struct ipc_dgpu {
    struct xfer_kbatch *kb;
    pthread_cond_t cv;               /* a launch queued, or stop */
    struct dgpu_launch *head, *tail; /* in flight, in launch order */
    pthread_t poller;
    bool stop;
};

/* Between two event queries while launches are in flight the poller
 * pauses (~1 us), it does not sleep: each microsecond between a kernel's
 * end and its report is 0.4 % of a 512 MiB request on one H200 (0.26 ms
 * of copy), and naps of 2 us (with 1 us timer slack) reported ~4 us later
 * (docs/gpu.md, 2026-11-29) while waking the thread every ~3 us anyway.
 * It sleeps on its condition variable whenever nothing is in flight.
 * XFER_DGPU_NAP_NS=N: naps of N ns instead (the way before: 2000);
 * XFER_DGPU_TRACE=1: the launches' times on stderr at exit. */
#define DGPU_NAP_NS 0
static long dgpu_nap_ns = -1;
static int dgpu_tracing;
#define DGPU_TR_MAX 4096
static struct dgpu_tr dgpu_trs[DGPU_TR_MAX];
static unsigned dgpu_ntr;

static uint64_t dgpu_ns(void)
{
    return dgpu_tracing ? xfer_mono_ns() : 0;
}

static void dgpu_trace_dump(void)
{
    unsigned n = __atomic_load_n(&dgpu_ntr, __ATOMIC_ACQUIRE);
    n = n < DGPU_TR_MAX ? n : DGPU_TR_MAX;
    for (unsigned i = 0; i < n; i++) {
        const struct dgpu_tr *t = &dgpu_trs[i];
        fprintf(stderr, "dgpu-trace %llu %llu %llu %llu %llu %.1f %zu %c\n",
                (unsigned long long)t->post, (unsigned long long)t->go,
                (unsigned long long)t->launched, (unsigned long long)t->seen,
                (unsigned long long)t->reported, t->gpu_us, t->n, t->kind);
    }
}

static void dgpu_env(void)
{
    if (__atomic_load_n(&dgpu_nap_ns, __ATOMIC_ACQUIRE) >= 0)
        return;
    const char *e = getenv("XFER_DGPU_TRACE"), *nap = getenv("XFER_DGPU_NAP_NS");
    dgpu_tracing = e && *e == '1';
    if (dgpu_tracing)
        atexit(dgpu_trace_dump);
    long v = nap ? atol(nap) : DGPU_NAP_NS;
    __atomic_store_n(&dgpu_nap_ns, v >= 0 && v < 1000000 ? v : DGPU_NAP_NS, __ATOMIC_RELEASE);
}

static void dgpu_trace_end(struct dgpu_launch *L)
{
    if (!dgpu_tracing)
        return;
    L->tr.reported = xfer_mono_ns();
    unsigned i = __atomic_fetch_add(&dgpu_ntr, 1, __ATOMIC_ACQ_REL);
    if (i < DGPU_TR_MAX)
        dgpu_trs[i] = L->tr;
}

/* After the kernel (status: the launch's outcome): drops the pins, ends the
 * local I/O and reports, one lock round per batch for each (a request's
 * 32 items one by one took 12 us, three rounds each); the entry's user
 * goes last (the table frees an entry, and unmaps the control page, only
 * once it has none). */
static void dgpu_done(struct dgpu_launch *L, int status, const char *why)
{
    struct xfer_chunk_end v[64];
    for (size_t k = 0; k < L->n; k++)
        __atomic_sub_fetch(&L->ctl[L->it[k].d->slot].pins, 1, __ATOMIC_SEQ_CST);
    for (size_t s = 0, e; s < L->n; s = e) {
        for (e = s + 1; e < L->n && L->it[e].b == L->it[s].b; e++)
            ;
        xfer_batch_io_end_n(L->it[s].b, (int)(e - s));
    }
    for (size_t s = 0; s < L->n; s += 64) {
        size_t m = L->n - s < 64 ? L->n - s : 64;
        for (size_t k = 0; k < m; k++) {
            const struct dgpu_item *x = &L->it[s + k];
            v[k] = (struct xfer_chunk_end){x->b, x->i, status ? 0 : x->bytes, status,
                                           status ? why : NULL};
        }
        xfer_batch_chunks_done_put(v, m);
    }
    for (size_t k = 0; k < L->n; k++)
        __atomic_sub_fetch(&L->it[k].d->users, 1, __ATOMIC_ACQ_REL);
    dgpu_trace_end(L);
    free(L);
}

/* Between two queries of a launch in flight: a nap, or a few pauses. */
static void dgpu_nap(void)
{
    long ns = __atomic_load_n(&dgpu_nap_ns, __ATOMIC_RELAXED);
    if (ns > 0) {
        struct timespec nap = {0, ns};
        nanosleep(&nap, NULL);
        return;
    }
    for (int k = 0; k < 32; k++) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ volatile("yield");
#endif
    }
}

static void *dgpu_poller(void *arg)
{
    struct ipc_conn *c = arg;
    struct ipc_dgpu *g = c->dgpu;
    char why[160];
    prctl(PR_SET_TIMERSLACK, 1000UL); /* naps (XFER_DGPU_NAP_NS) not 50 us longer */
    pthread_mutex_lock(&c->dkb_mu);
    for (;;) {
        while (!g->head && !g->stop)
            pthread_cond_wait(&g->cv, &c->dkb_mu);
        struct dgpu_launch *L = g->head;
        if (!L)
            break; /* stopping, and nothing is in flight */
        int rc = xfer_kbatch_poll(g->kb, L->ticket);
        if (rc == -XFER_EINPROGRESS) {
            pthread_mutex_unlock(&c->dkb_mu);
            dgpu_nap();
            pthread_mutex_lock(&c->dkb_mu);
            continue;
        }
        if (dgpu_tracing) {
            L->tr.seen = xfer_mono_ns();
            L->tr.gpu_us = xfer_kbatch_gpu_us(g->kb, L->ticket);
        }
        snprintf(why, sizeof(why), "batched GPU copy (GPU loan): %s",
                 xfer_kbatch_last_error(g->kb));
        g->head = L->next;
        if (!g->head)
            g->tail = NULL;
        pthread_mutex_unlock(&c->dkb_mu);
        dgpu_done(L, rc, why);
        pthread_mutex_lock(&c->dkb_mu);
    }
    pthread_mutex_unlock(&c->dkb_mu);
    return NULL;
}

/* dkb_mu held: the connection's loan state, its poller started. */
static struct ipc_dgpu *dgpu_get(struct ipc_conn *c)
{
    if (c->dgpu)
        return c->dgpu;
    dgpu_env();
    struct ipc_dgpu *g = calloc(1, sizeof(*g));
    if (!g || xfer_kbatch_new(&g->kb) < 0) {
        free(g);
        return NULL;
    }
    pthread_cond_init(&g->cv, NULL);
    c->dgpu = g;
    if (pthread_create(&g->poller, NULL, dgpu_poller, c) != 0) {
        c->dgpu = NULL;
        pthread_cond_destroy(&g->cv);
        xfer_kbatch_free(g->kb);
        free(g);
        return NULL;
    }
    return g;
}

void ipc_dgpu_fini(struct ipc_conn *c)
{
    pthread_mutex_lock(&c->dkb_mu);
    struct ipc_dgpu *g = c->dgpu;
    if (g) {
        g->stop = true; /* the poller reports what is in flight, then ends */
        pthread_cond_signal(&g->cv);
    }
    pthread_mutex_unlock(&c->dkb_mu);
    if (!g)
        return;
    pthread_join(g->poller, NULL);
    pthread_cond_destroy(&g->cv);
    xfer_kbatch_free(g->kb);
    free(g);
    c->dgpu = NULL;
}

/* Every segment of bl lies in the owner's len bytes: each stream's base
 * plus its largest remote id's block (the engine made sure nothing wraps).
 * *ids / *top memoize the last id list's largest id (a request's items
 * share one). */
static bool dgpu_fits(const struct xfer_block_list *bl, uint64_t len, const uint64_t **ids,
                      uint64_t *top)
{
    if (*ids != bl->remote_ids) {
        *top = 0;
        for (uint32_t i = 0; i < bl->nids; i++)
            *top = bl->remote_ids[i] > *top ? bl->remote_ids[i] : *top;
        *ids = bl->remote_ids;
    }
    for (uint32_t s = 0; s < bl->nstreams; s++)
        if (!xfer_range_ok(bl->remote_base[s] + *top * bl->remote_stride, bl->len, len))
            return false;
    return true;
}

/* Segments this long go to the copy engine (ipc_copy.c's
 * IPC_KBATCH_MAX_ITEM: ahead of the kernel from 16 MiB on). */
#define DGPU_CE_MIN (16ull << 20)
/* Segments of one post's launch at most (24 MiB of staged descriptors);
 * vectored items past it go to the worker. */
#define DGPU_SEGS_MAX (1u << 20)

/* What one post launches: block items as block runs (one launch, lb);
 * plain and vectored items as segment runs (ls), plain ones of DGPU_CE_MIN
 * and more as copy-engine copies in the same ticket. */
struct dgpu_post {
    struct dgpu_launch *lb, *ls;
    struct xfer_block_run *br;
    struct xfer_copy_run *cr;
    struct xfer_seg *one; /* plain items' segment */
    struct xfer_copy_desc *ce;
    size_t ncr, nce, nsegs; /* nsegs: of cr */
    uint64_t ctotal;        /* bytes of cr */
    const uint64_t *ids;
    uint64_t top;
    int pair[2]; /* the launches' GPU (the owner memory's) and ours */
};

/* Vectored segments all inside the owner's len bytes and under the
 * copy-engine size (larger ones: the worker, one copy each); their sum. */
static bool dgpu_segs_fit(const struct xfer_seg *v, size_t n, uint64_t len, uint64_t *sum)
{
    *sum = 0;
    for (size_t k = 0; k < n; k++) {
        if (v[k].len >= DGPU_CE_MIN || !xfer_range_ok(v[k].remote_off, v[k].len, len))
            return false;
        *sum += v[k].len;
    }
    return true;
}

/* Takes item idx (entry d) into P and runs: 0 taken, 1 for the worker
 * (outside the loan, another GPU pair, withdrawn), -1 ended (d let go). */
static int dgpu_take(struct ipc_direct_table *t, xfer_batch *b, size_t idx, struct ipc_direct *d,
                     struct dgpu_post *P)
{
    const struct xfer_item *it = xfer_batch_item(b, idx);
    struct xfer_block_list bl;
    size_t nseg = 0;
    const struct xfer_seg *v = xfer_batch_item_segs(b, idx, &nseg);
    bool blk = !v && xfer_batch_item_blocks(b, idx, &bl);
    uint64_t bytes = it->len;
    int ldev = xfer_region_device(it->local);
    if (blk ? !dgpu_fits(&bl, d->len, &P->ids, &P->top)
        : v ? P->nsegs + nseg > DGPU_SEGS_MAX || !dgpu_segs_fit(v, nseg, d->len, &bytes)
            : !xfer_range_ok(it->remote_off, it->len, d->len))
        return 1; /* the owner's check names the segment */
    if ((P->lb->n || P->ls->n) && (P->pair[0] != d->dev || P->pair[1] != ldev))
        return 1; /* one GPU pair per post */
    if (!xfer_batch_io_begin(b, idx)) {
        __atomic_sub_fetch(&d->users, 1, __ATOMIC_ACQ_REL);
        return -1; /* cancelled or timed out: its memory is off limits */
    }
    struct ipc_ctl_slot *s = &t->ctl[d->slot];
    __atomic_add_fetch(&s->pins, 1, __ATOMIC_SEQ_CST); /* pin, then look (ipc_direct.c) */
    if (__atomic_load_n(&s->key, __ATOMIC_SEQ_CST) != ipc_ctl_key(d->id, d->gen)) {
        __atomic_sub_fetch(&s->pins, 1, __ATOMIC_SEQ_CST);
        xfer_batch_io_end(b, idx);
        return 1; /* withdrawn: the owner will say why */
    }
    P->pair[0] = d->dev, P->pair[1] = ldev;
    char *local = (char *)xfer_region_ptr(it->local);
    bool rd = it->op == XFER_OP_READ;
    struct dgpu_launch *L = blk ? P->lb : P->ls;
    if (blk) {
        P->br[L->n] = ipc_block_run(local, d->base, &bl, 0, bl.nstreams * bl.nids, rd);
    } else if (!v && it->len >= DGPU_CE_MIN) {
        char *l = local + it->local_off, *r = d->base + it->remote_off;
        P->ce[P->nce++] = (struct xfer_copy_desc){rd ? l : r, rd ? r : l, it->len};
    } else {
        if (!v) {
            P->one[P->ncr] = (struct xfer_seg){it->local_off, it->remote_off, it->len};
            v = &P->one[P->ncr], nseg = 1;
        }
        P->cr[P->ncr++] = (struct xfer_copy_run){.a = local,
                                                 .b = d->base,
                                                 .segs = (const uint64_t *)(const void *)v,
                                                 .n = nseg,
                                                 .a_is_dst = rd};
        P->ctotal += bytes;
        P->nsegs += nseg;
    }
    L->it[L->n++] = (struct dgpu_item){b, idx, d, bytes};
    return 0;
}

/* The launch failed: nothing of L will be reported by it. */
static void dgpu_undo(struct dgpu_launch *L, size_t *back, size_t *nb)
{
    for (size_t k = 0; k < L->n; k++) {
        struct dgpu_item *x = &L->it[k];
        __atomic_sub_fetch(&L->ctl[x->d->slot].pins, 1, __ATOMIC_SEQ_CST);
        xfer_batch_io_end(x->b, x->i);
        __atomic_sub_fetch(&x->d->users, 1, __ATOMIC_ACQ_REL);
        back[(*nb)++] = x->i;
    }
}

/* dkb_mu held: starts L (block runs, or P's segment runs and copies) and
 * queues it for the poller; false if it did not start (logged). */
static bool dgpu_launch(struct ipc_dgpu *g, struct dgpu_launch *L, const struct dgpu_post *P)
{
    uint64_t mask = P->pair[1] != P->pair[0] ? 1ull << P->pair[1] : 0;
    L->tr.go = dgpu_ns();
    int t = !g           ? -XFER_ENOMEM
            : L == P->lb ? xfer_kbatch_start_blocks(g->kb, P->pair[0], mask, P->br, L->n)
                         : xfer_kbatch_start_copies(g->kb, P->pair[0], mask, P->cr, P->ncr,
                                                    P->ctotal, P->ce, P->nce);
    if (t < 0) {
        xfer_debug("ipc: GPU loan launch on cuda:%d not used (%s): %s", P->pair[0],
                   xfer_strerror(t), g ? xfer_kbatch_last_error(g->kb) : "no poller");
        return false;
    }
    L->tr.launched = dgpu_ns();
    L->tr.n = L->n;
    L->ticket = t;
    if (g->tail)
        g->tail->next = L;
    else
        g->head = L;
    g->tail = L;
    pthread_cond_signal(&g->cv);
    return true;
}

static struct dgpu_launch *dgpu_launch_new(struct ipc_conn *c, size_t n, uint64_t t_post, char kind)
{
    struct dgpu_launch *L = malloc(sizeof(*L) + n * sizeof(L->it[0]));
    if (L)
        *L = (struct dgpu_launch){
            .ctl = c->direct.ctl, .ticket = -1, .tr.post = t_post, .tr.kind = kind};
    return L;
}

size_t ipc_dgpu_post(struct ipc_conn *c, xfer_batch *b, const size_t *idx, struct ipc_direct **d,
                     size_t n, size_t *back)
{
    size_t nb = 0;
    uint64_t t_post = dgpu_ns();
    struct dgpu_post P = {.lb = dgpu_launch_new(c, n, t_post, 'b'),
                          .ls = dgpu_launch_new(c, n, t_post, 's'),
                          .br = malloc(n * sizeof(*P.br)),
                          .cr = malloc(n * sizeof(*P.cr)),
                          .one = malloc(n * sizeof(*P.one)),
                          .ce = malloc(n * sizeof(*P.ce)),
                          .pair = {-1, -1}};
    bool ok = P.lb && P.ls && P.br && P.cr && P.one && P.ce;
    for (size_t k = 0; k < n; k++) {
        int rc = ok ? dgpu_take(&c->direct, b, idx[k], d[k], &P) : 1;
        if (rc == 1) {
            __atomic_sub_fetch(&d[k]->users, 1, __ATOMIC_ACQ_REL);
            back[nb++] = idx[k];
        }
    }
    struct dgpu_launch *Ls[2] = {P.lb, P.ls};
    for (int w = 0; ok && w < 2; w++) {
        struct dgpu_launch *L = Ls[w];
        if (!L->n)
            continue;
        xfer_batch_hold_n(b, (int)L->n); /* b outlives the completion; put there */
        size_t taken = L->n;
        pthread_mutex_lock(&c->dkb_mu);
        bool started = dgpu_launch(dgpu_get(c), L, &P);
        pthread_mutex_unlock(&c->dkb_mu);
        if (started) {
            Ls[w] = NULL; /* the poller's now */
            continue;
        }
        dgpu_undo(L, back, &nb);
        for (size_t k = 0; k < taken; k++)
            xfer_batch_put(b);
    }
    free(Ls[0]), free(Ls[1]);
    free(P.br), free(P.cr), free(P.one), free(P.ce);
    return nb;
}
