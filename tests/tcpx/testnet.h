/*
 * xfertest, the test NCCL net plugin (testnet.c: what it does; testnet_abi.c:
 * the v7..v12 structs the transport loads). The operations below have the
 * newest shapes; testnet_abi.c adapts the older ones. Nothing else
 * includes this file.
 */
#ifndef XFER_TESTNET_H
#define XFER_TESTNET_H

#include "nccl_net.h"

#include <stdbool.h>
#include <stddef.h>

int tn_init(xnccl_logger_t log);
int tn_devices(int *n);
/* XNCCL_PTR_* this process supports (the mode decides). */
int tn_ptr_support(void);
/* XFER_TESTNET_MODE=unpack: receives land in a bounce buffer. */
bool tn_unpack_mode(void);
/* The context of the v11+ calls (they ignore it): not NULL. */
void *tn_context(void);
int tn_listen(int dev, void *handle, void **listen_comm);
int tn_connect(void *handle, void **send_comm);
int tn_accept(void *listen_comm, void **recv_comm, xnccl_dh **dev);
int tn_reg_mr(void *comm, void *data, size_t size, int type, void **mh);
int tn_dereg_mr(void *comm, void *mh);
int tn_isend(void *comm, void *data, size_t size, int tag, void *mh, void **request);
int tn_irecv(void *comm, int n, void **data, size_t *sizes, int *tags, void **mh, void **request);
int tn_test(void *request, int *done, int *size);
int tn_irecv_consumed(void *comm, int n, void *request);
int tn_iflush(void *comm, int n, void **data, int *sizes, void **mh, void **request);
int tn_close(void *comm);
int tn_close_listen(void *listen_comm);

#endif
