/* libFuzzer target: the ipc socket messages. The input is written to a unix
 * socketpair and read back message by message the way both ends of the ipc
 * transport read (ipc_recv: magic, version, length limit, payload), each
 * message then checked against the size and field rules of every type
 * (ipc_msg_check); what passes is indexed as the owner and initiator do.
 * Nothing may crash or read past what was received. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ipc/ipc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint32_t types[] = {IPC_HELLO,    IPC_MAP_REQ, IPC_MAP_RESP, IPC_ACQ_REQ,
                                 IPC_ACQ_RESP, IPC_REL,     IPC_ACQV_REQ, IPC_ACQV_RESP};

/* An IPC_ACQV_REQ walked as the owner walks it (ipc_serve.c). */
static uint64_t use_acqv(const struct ipc_hdr *h, const uint8_t *buf)
{
    uint64_t sum = 0;
    const uint8_t *at = buf;
    for (uint32_t i = 0; i < h->count; i++) {
        const struct ipc_acqv_req *q = (const void *)at;
        at += sizeof(*q);
        if (q->nseg == IPC_ACQV_HULL) {
            const struct ipc_acqv_hull *hl = (const void *)at;
            sum += hl->off + hl->len + hl->bytes;
            at += sizeof(*hl);
            continue;
        }
        const struct xfer_range *v = (const void *)at;
        for (uint32_t k = 0; k < q->nseg; k++)
            sum += v[k].off + v[k].len;
        at += q->nseg * sizeof(*v);
    }
    return sum;
}

static uint64_t use(const struct ipc_hdr *h, const uint8_t *buf)
{
    uint64_t sum = 0;
    if (h->type == IPC_ACQ_REQ)
        for (uint32_t i = 0; i < h->count; i++)
            sum += ((const struct ipc_acq_req *)buf)[i].len;
    if (h->type == IPC_ACQ_RESP) {
        const struct ipc_revoked *gone =
            (const void *)(buf + (size_t)h->count * sizeof(struct ipc_acq_resp));
        for (size_t i = 0; i < (h->bytes - h->count * sizeof(struct ipc_acq_resp)) / sizeof(*gone);
             i++)
            sum += gone[i].id;
    }
    if (h->type == IPC_REL)
        for (uint32_t i = 0; i < h->count; i++)
            sum += ((const uint32_t *)buf)[i];
    if (h->type == IPC_ACQV_REQ)
        sum += use_acqv(h, buf);
    if (h->type == IPC_ACQV_RESP)
        for (uint32_t i = 0; i < h->count; i++)
            sum += ((const struct ipc_acqv_resp *)buf)[i].bad;
    return sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int sv[2];
    if (size > 65536 || socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
        return 0;
    /* the socket buffer holds 64 KiB: write all, then read until the end */
    int big = 1 << 18;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
    if (write(sv[0], data, size) != (ssize_t)size) {
        close(sv[0]);
        close(sv[1]);
        return 0;
    }
    close(sv[0]);
    /* as large as the biggest message a receiver accepts */
    size_t max = IPC_ACQV_BYTES_MAX + 64;
    uint8_t *buf = malloc(max);
    struct ipc_hdr h;
    while (buf && ipc_recv(sv[1], &h, buf, (uint32_t)max, NULL, 10) == 0) {
        for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
            if (ipc_msg_check(&h, buf, types[t], 0) == 0) {
                if (h.bytes > max || h.type != types[t])
                    __builtin_trap();
                volatile uint64_t sink = use(&h, buf);
                (void)sink;
            }
    }
    free(buf);
    close(sv[1]);
    return 0;
}
