/*
 * The worker's groups and their copies (ipc_conn.c takes, checks and pins
 * a group; ipc_copy.c and ipc_hcopy.c copy it).
 */
#ifndef XFER_IPC_COPY_H
#define XFER_IPC_COPY_H

#include "ipc_conn.h"

/* A group of up to IPC_BATCH_MAX items, pinned at the owner together. */
struct ipc_group {
    struct ipc_job *jobs;
    size_t n;
    int rc;                     /* connection error while starting */
    struct ipc_cuda_mark *mark; /* CUDA copies still in flight */
    struct ipc_kcopy *kc;       /* GPU<->GPU items, batched when many */
    size_t nkc;
    struct ipc_krun *kr; /* vectored GPU<->GPU jobs, one run each */
    size_t nkr;
    bool kc_running; /* some launched as batched kernels */
    int64_t t_us[3]; /* taken, pinned, copies started (for the debug line) */
};

/* ipc_copy.c: host copies run in _start; CUDA copies are started and left
 * in flight behind g->mark or as batched kernels (g->kc_running); _finish
 * waits for them and ends their local I/O. */
void ipc_jobs_copy_start(struct ipc_conn *c, struct ipc_group *g);
void ipc_jobs_copy_finish(struct ipc_conn *c, struct ipc_group *g);

/* ipc_hcopy.c: copies the begun host jobs (j->host) of jobs[0..n), over
 * the copy threads when there are enough bytes, and ends their local I/O. */
void ipc_jobs_copy_host(struct ipc_conn *c, struct ipc_job *jobs, size_t n);

#endif
