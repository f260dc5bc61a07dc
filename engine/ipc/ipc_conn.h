/*
 * The initiator's connection to one owner (ipc_conn.c: the worker, connect
 * and close; ipc_post.c: posting items, direct copies, engine messages).
 */
#ifndef XFER_IPC_CONN_H
#define XFER_IPC_CONN_H

#include "ipc.h"
#include "ipc_map.h"

struct ipc_work {
    xfer_batch *b;
    size_t i;
};

struct ipc_msgq { /* engine messages waiting for the worker */
    struct xfer_msg *m;
    struct ipc_msgq *next;
};

struct ipc_conn {
    struct xfer_conn base;
    struct ipc_transport *t;
    int fd;
    pid_t pid;
    int io_timeout_ms;
    pthread_t worker;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct ipc_work *q; /* ring of queued items */
    size_t qhead, qlen, qcap;
    bool stop, broken;
    struct ipc_map_cache maps;
    struct ipc_cuda_copier *copier; /* created on the first CUDA item */
    struct xfer_kbatch *kb;         /* batched GPU<->GPU copies, ipc_kbatch.c */
    uint64_t group_bytes;           /* see take_work */
    struct ipc_msgq *mhead, *mtail; /* mu */
    struct ipc_direct_table direct; /* entries: mu */
    int64_t direct_check_ms;        /* last direct_check */
};

/* Queues items for the worker (which asks the owner); on failure reports
 * them failed and returns < 0. */
int ipc_conn_queue(struct ipc_conn *c, xfer_batch *b, const size_t *idx, size_t n);

#endif
