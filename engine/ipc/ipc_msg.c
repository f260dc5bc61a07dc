/* The size rules of every ipc message, in one place: the owner's and the
 * initiator's decoders both call ipc_msg_check after ipc_recv (which checks
 * magic, version and the length limit), and the fuzz target feeds it any
 * byte stream (tests/fuzz/fuzz_ipc.c). */
#include "ipc.h"

static bool records(const struct ipc_hdr *h, uint32_t min, uint32_t max, size_t each)
{
    return h->count >= min && h->count <= max && h->bytes == (uint64_t)h->count * each;
}

static bool status_ok(int32_t st)
{
    return st <= 0 && st > -XFER_ERR_MAX;
}

/* count records of an ipc_acqv_req and its ranges, exactly filling bytes. */
static bool acqv_ok(const struct ipc_hdr *h, const void *payload)
{
    if (h->count == 0 || h->count > IPC_BATCH_MAX || h->bytes > IPC_ACQV_BYTES_MAX)
        return false;
    size_t at = 0, segs = 0;
    for (uint32_t i = 0; i < h->count; i++) {
        if (h->bytes - at < sizeof(struct ipc_acqv_req))
            return false;
        const struct ipc_acqv_req *q = (const void *)((const char *)payload + at);
        at += sizeof(*q);
        if (q->nseg == IPC_ACQV_HULL) {
            const struct ipc_acqv_hull *hl = (const void *)((const char *)payload + at);
            if (h->bytes - at < sizeof(*hl) || hl->nseg == 0 || hl->nseg > IPC_VEC_SEGS_MAX)
                return false;
            at += sizeof(*hl);
            segs++;
            continue;
        }
        if (q->nseg > IPC_VEC_SEGS_MAX || (h->bytes - at) / sizeof(struct xfer_range) < q->nseg)
            return false;
        at += q->nseg * sizeof(struct xfer_range);
        segs += q->nseg;
    }
    return at == h->bytes && segs <= IPC_ACQV_SEGS_MAX;
}

/* count answers of each bytes, each starting with its int32 status, then up
 * to IPC_REVOKED_MAX revocations. */
static bool answers_ok(const struct ipc_hdr *h, const void *payload, size_t each)
{
    size_t answers = (size_t)h->count * each;
    if (h->count == 0 || h->count > IPC_BATCH_MAX || h->bytes < answers ||
        (h->bytes - answers) % sizeof(struct ipc_revoked) ||
        (h->bytes - answers) / sizeof(struct ipc_revoked) > IPC_REVOKED_MAX)
        return false;
    for (uint32_t i = 0; i < h->count; i++)
        if (!status_ok(*(const int32_t *)((const char *)payload + i * each)))
            return false;
    return true;
}

int ipc_msg_check(const struct ipc_hdr *h, const void *payload, uint32_t want_type,
                  uint32_t want_count)
{
    if (h->type != want_type || (want_count && h->count != want_count))
        return -XFER_EPROTO;
    switch (h->type) {
    case IPC_HELLO: {
        const struct ipc_hello *m = payload;
        return records(h, 1, 1, sizeof(*m)) && m->probe_len == sizeof(m->probe_cookie)
                   ? 0
                   : -XFER_EPROTO;
    }
    case IPC_MAP_REQ:
        return records(h, 1, 1, sizeof(struct ipc_map_req)) ? 0 : -XFER_EPROTO;
    case IPC_MAP_RESP: {
        const struct ipc_map_resp *m = payload;
        if (!records(h, 1, 1, sizeof(*m)) || !status_ok(m->status) || m->mech > IPC_MECH_CUMEM ||
            (m->has_fd != 0 && m->has_fd != 1))
            return -XFER_EPROTO;
        return 0;
    }
    case IPC_ACQ_REQ:
        return records(h, 1, IPC_BATCH_MAX, sizeof(struct ipc_acq_req)) ? 0 : -XFER_EPROTO;
    case IPC_ACQ_RESP:
        return answers_ok(h, payload, sizeof(struct ipc_acq_resp)) ? 0 : -XFER_EPROTO;
    case IPC_ACQV_REQ:
        return acqv_ok(h, payload) ? 0 : -XFER_EPROTO;
    case IPC_ACQV_RESP: {
        if (!answers_ok(h, payload, sizeof(struct ipc_acqv_resp)))
            return -XFER_EPROTO;
        const struct ipc_acqv_resp *r = payload;
        for (uint32_t i = 0; i < h->count; i++)
            if (r[i].flags & ~IPC_ACQV_NEED_LIST)
                return -XFER_EPROTO;
        return 0;
    }
    case IPC_REL:
        return records(h, 0, IPC_BATCH_MAX, sizeof(uint32_t)) ? 0 : -XFER_EPROTO;
    case IPC_BYE:
    case IPC_RING_REQ:
    case IPC_RING_BELL:
        return records(h, 0, 0, 0) ? 0 : -XFER_EPROTO;
    case IPC_RING_RESP:
        return records(h, 1, 1, sizeof(int32_t)) && status_ok(*(const int32_t *)payload)
                   ? 0
                   : -XFER_EPROTO;
    default:
        return -XFER_EPROTO;
    }
}
