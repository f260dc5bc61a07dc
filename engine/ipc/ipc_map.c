/* Initiator-side cache of opened remote regions (see ipc_map.h). */
#include "ipc_map.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define IPC_MAP_LIVE_MAX 4096

static void map_free(struct ipc_map *m)
{
    if (m->base)
        ipc_host_unmap(m->base, m->len);
    if (m->cuda)
        ipc_cuda_import_close(m->cuda);
    free(m);
}

static void retire_if(struct ipc_map_cache *mc, bool (*pred)(const struct ipc_map *, uint32_t),
                      uint32_t arg)
{
    struct ipc_map **pp = &mc->live;
    while (*pp) {
        struct ipc_map *m = *pp;
        if (pred(m, arg)) {
            *pp = m->next;
            m->next = mc->retired;
            mc->retired = m;
            mc->nlive--;
        } else {
            pp = &m->next;
        }
    }
}

static bool same_id(const struct ipc_map *m, uint32_t id)
{
    return m->id == id;
}
static bool any(const struct ipc_map *m, uint32_t unused)
{
    (void)m;
    (void)unused;
    return true;
}

void ipc_map_forget(struct ipc_map_cache *mc, uint32_t id)
{
    retire_if(mc, same_id, id);
}

void ipc_map_forget_gen(struct ipc_map_cache *mc, uint32_t id, uint32_t gen)
{
    for (struct ipc_map *m = mc->live; m; m = m->next)
        if (m->id == id && m->gen == gen) {
            ipc_map_forget(mc, id); /* at most one generation of an id is live */
            return;
        }
}

size_t ipc_map_count(const struct ipc_map_cache *mc)
{
    return mc->nlive;
}

void ipc_map_gc(struct ipc_map_cache *mc)
{
    while (mc->retired) {
        struct ipc_map *m = mc->retired;
        mc->retired = m->next;
        map_free(m);
    }
}

void ipc_map_clear(struct ipc_map_cache *mc)
{
    retire_if(mc, any, 0);
    ipc_map_gc(mc);
}

/* Turns the owner's answer (and fd) into an opened entry; consumes fd. */
static int map_open(struct ipc_map *m, const struct ipc_map_resp *r, int fd, char *why,
                    size_t why_len)
{
    int rc = 0;
    struct stat st;
    switch (r->mech) {
    case IPC_MECH_MEMFD:
        if (fd < 0 || fstat(fd, &st) < 0 || (uint64_t)st.st_size < r->len) {
            snprintf(why, why_len, "owner sent no memfd, or one shorter than the region");
            rc = -XFER_EPROTO;
            break;
        }
        /* An owner's memfd that can shrink would SIGBUS us mid-copy. */
        if (xfer_memfd_seal_shrink(fd, false, why, why_len) < 0) {
            rc = -XFER_EPROTO;
            break;
        }
        m->base = ipc_host_map(fd, r->len, (r->access & XFER_ACCESS_W) != 0, &rc);
        if (!m->base)
            snprintf(why, why_len, "mmap of the peer's memfd (%llu bytes): %s",
                     (unsigned long long)r->len, xfer_strerror(rc));
        break;
    case IPC_MECH_CMA:
        m->addr = r->addr;
        break;
    case IPC_MECH_CUDA:
    case IPC_MECH_CUMEM:
        rc = ipc_cuda_import(r, fd, &m->cuda, why, why_len);
        fd = -1; /* taken by the import */
        break;
    default:
        snprintf(why, why_len, "owner answered with unknown mechanism %u", r->mech);
        rc = -XFER_EPROTO;
    }
    if (fd >= 0)
        close(fd);
    return rc;
}

static int ask_owner(int fd, uint32_t id, uint32_t gen, enum xfer_op op, int timeout_ms,
                     struct ipc_map_resp *r, int *got_fd, char *why, size_t why_len)
{
    struct ipc_map_req q = {.id = id, .gen = gen, .op = op};
    struct ipc_hdr h;
    int rc = ipc_send(fd, IPC_MAP_REQ, 1, &q, sizeof(q), -1, timeout_ms);
    if (rc == 0)
        rc = ipc_recv(fd, &h, r, sizeof(*r), got_fd, timeout_ms);
    if (rc == 0)
        rc = ipc_msg_check(&h, r, IPC_MAP_RESP, 1);
    if (rc < 0) {
        snprintf(why, why_len, "asking the owner for region %u: %s", id, xfer_strerror(rc));
        return rc;
    }
    r->why[sizeof(r->why) - 1] = 0;
    if (r->status != 0) { /* a real code: ipc_msg_check */
        snprintf(why, why_len, "owner: %s", r->why[0] ? r->why : xfer_strerror(r->status));
        return r->status;
    }
    return 0;
}

int ipc_map_find(struct ipc_map_cache *mc, uint32_t id, uint32_t gen, const struct ipc_map **out)
{
    for (struct ipc_map *m = mc->live; m; m = m->next) {
        if (m->id == id && m->gen == gen) {
            *out = m;
            return 0;
        }
    }
    return -XFER_ENOENT;
}

int ipc_map_get(struct ipc_map_cache *mc, int fd, uint32_t id, uint32_t gen, enum xfer_op op,
                int timeout_ms, const struct ipc_map **out, char *why, size_t why_len)
{
    for (struct ipc_map *m = mc->live; m; m = m->next) {
        if (m->id == id && m->gen == gen) {
            *out = m;
            return 0;
        }
    }
    struct ipc_map_resp r;
    int got_fd = -1;
    int rc = ask_owner(fd, id, gen, op, timeout_ms, &r, &got_fd, why, why_len);
    if (rc < 0) {
        if (got_fd >= 0)
            close(got_fd);
        if (rc == -XFER_ESTALE || rc == -XFER_ENOENT)
            ipc_map_forget(mc, id);
        return rc;
    }
    struct ipc_map *m = calloc(1, sizeof(*m));
    if (!m) {
        if (got_fd >= 0)
            close(got_fd);
        return -XFER_ENOMEM;
    }
    *m = (struct ipc_map){.id = id,
                          .gen = gen,
                          .mech = r.mech,
                          .access = r.access,
                          .len = r.len,
                          /* memfd loans, and CUDA ones (GPU loans, ipc_dgpu.c) */
                          .ctl_slot = r.mech == IPC_MECH_MEMFD || r.mech == IPC_MECH_CUDA ||
                                              r.mech == IPC_MECH_CUMEM
                                          ? r.ctl_slot
                                          : IPC_SLOT_NONE};
    rc = map_open(m, &r, got_fd, why, why_len);
    if (rc < 0) {
        map_free(m);
        return rc;
    }
    ipc_map_forget(mc, id); /* older generations of this id are gone */
    if (mc->nlive >= IPC_MAP_LIVE_MAX)
        retire_if(mc, any, 0);
    m->next = mc->live;
    mc->live = m;
    mc->nlive++;
    *out = m;
    return 0;
}
