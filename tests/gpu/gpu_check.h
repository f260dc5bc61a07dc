/* Checks shared by the GPU test and bench programs: CK() ends the program on
 * a CUDA error; EXPECT() counts a failure in the including file's
 * `failures` and goes on (gpu_test.h defines both for the kernel tests);
 * enable_peer() turns on peer access from a to b. */
#ifndef XFER_GPU_CHECK_H
#define XFER_GPU_CHECK_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#ifndef EXPECT
#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)
#endif

/* Peer access from GPU a to GPU b: 1 when on (now or before), 0 if the
 * pair cannot have it. */
static inline int enable_peer(int a, int b)
{
    int can = 0;
    CK(cudaDeviceCanAccessPeer(&can, a, b));
    if (!can)
        return 0;
    CK(cudaSetDevice(a));
    cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled)
        (void)cudaGetLastError();
    else
        CK(e);
    return 1;
}

#endif
