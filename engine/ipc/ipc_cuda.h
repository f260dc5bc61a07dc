/* CUDA helpers shared by ipc_cuda.c (handles) and ipc_cuda_copy.c (copies). */
#ifndef XFER_IPC_CUDA_H
#define XFER_IPC_CUDA_H

#include "ipc.h"

#if XFER_WITH_CUDA
#include <cuda_runtime_api.h>

#define IPC_MAX_DEVS 64
/* Translates e into -XFER_ENODEV/-XFER_EIO with "what: <CUDA's text>" in why
 * and clears the thread's last CUDA error. */
int ipc_cuda_fail(cudaError_t e, const char *what, char *why, size_t why_len);
#endif

#endif
