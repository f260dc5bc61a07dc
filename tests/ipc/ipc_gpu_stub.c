/* GPU helpers of the ipc tests when built without CUDA: no devices. */
#include "ipc_test.h"

int ipc_gpu_count(void)
{
    return 0;
}
int ipc_gpu_can_peer(int a, int b)
{
    (void)a, (void)b;
    return 0;
}
int ipc_gpu_alloc(int dev, size_t len, bool cumem, void **out)
{
    (void)dev, (void)len, (void)cumem, (void)out;
    return -1;
}
void ipc_gpu_free(int dev, void *p, bool cumem, size_t len)
{
    (void)dev, (void)p, (void)cumem, (void)len;
}
int ipc_gpu_fill(int dev, void *p, size_t len, uint64_t seed)
{
    (void)dev, (void)p, (void)len, (void)seed;
    return -1;
}
int ipc_gpu_sum(int dev, const void *p, size_t len, uint64_t *out)
{
    (void)dev, (void)p, (void)len, (void)out;
    return -1;
}
double ipc_gpu_peer_gbps(void *dst, int ddev, const void *src, int sdev, size_t len, int slots,
                         int reps)
{
    (void)dst, (void)ddev, (void)src, (void)sdev, (void)len, (void)slots, (void)reps;
    return 0;
}
