/* rdma: device discovery — verbs devices, active ports, GID choice (RoCE v2
 * by default, XFER_RDMA_GID_INDEX to force one), link layer, MTU, speed,
 * PCI address and NUMA node; and the NIC nearest to a GPU. */
#include "rdma.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#if XFER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

int xrdma_devices_probe(char *why, size_t why_len)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n == 0) {
        snprintf(why, why_len, "no RDMA device (%s)", list ? "none listed" : strerror(errno));
        if (list) /* libibverbs crashes on NULL */
            ibv_free_device_list(list);
        return -XFER_ENODEV;
    }
    int active = 0;
    for (int i = 0; i < n && !active; i++) {
        struct ibv_context *c = ibv_open_device(list[i]);
        struct ibv_device_attr da;
        if (!c)
            continue;
        if (!ibv_query_device(c, &da))
            for (uint8_t p = 1; p <= da.phys_port_cnt && !active; p++) {
                struct ibv_port_attr pa;
                active = !ibv_query_port(c, p, &pa) && pa.state == IBV_PORT_ACTIVE;
            }
        ibv_close_device(c);
    }
    ibv_free_device_list(list);
    if (!active) {
        snprintf(why, why_len, "no RDMA device with an active port");
        return -XFER_ENODEV;
    }
    return 0;
}

/* Gb/s from the port's width and speed codes (ibv_query_port(3)). */
static uint32_t port_gbps(const struct ibv_port_attr *pa)
{
    int lanes = pa->active_width == 1    ? 1
                : pa->active_width == 2  ? 4
                : pa->active_width == 4  ? 8
                : pa->active_width == 8  ? 12
                : pa->active_width == 16 ? 2
                                         : 1;
    double lane = 0;
    switch (pa->active_speed) {
    case 1:
        lane = 2.5;
        break;
    case 2:
        lane = 5;
        break;
    case 4:
    case 8:
        lane = 10;
        break;
    case 16:
        lane = 14;
        break;
    case 32:
        lane = 25;
        break;
    case 64:
        lane = 50;
        break;
    case 128:
        lane = 100;
        break;
    default:
        lane = 200;
        break;
    }
    return (uint32_t)(lanes * lane);
}

/* RoCE: the first RoCE v2 GID with an IPv4 address, else the first RoCE v2
 * GID, else the first valid one; InfiniBand: index 0. */
static int choose_gid(struct ibv_context *c, uint8_t port, const struct ibv_port_attr *pa,
                      union ibv_gid *gid)
{
    const char *env = getenv("XFER_RDMA_GID_INDEX");
    if (env && *env) {
        int i = atoi(env);
        return i >= 0 && i < pa->gid_tbl_len && !ibv_query_gid(c, port, i, gid) ? i : -1;
    }
    if (pa->link_layer != IBV_LINK_LAYER_ETHERNET)
        return ibv_query_gid(c, port, 0, gid) ? -1 : 0;
    int best = -1, rank = 0;
    for (int i = 0; i < pa->gid_tbl_len; i++) {
        struct ibv_gid_entry e;
        if (ibv_query_gid_ex(c, port, (uint32_t)i, &e, 0))
            continue;
        static const union ibv_gid zero;
        if (!memcmp(&e.gid, &zero, sizeof(zero)))
            continue;
        int r = e.gid_type == IBV_GID_TYPE_ROCE_V2 ? (xfer_rdma_gid_ipv4(&e.gid, NULL) ? 3 : 2) : 1;
        if (r > rank) {
            rank = r;
            best = i;
            *gid = e.gid;
        }
    }
    return best;
}

/* Truncating copy (paths may exceed our fields; then they are just less useful). */
static void copy_str(char *dst, size_t len, const char *src)
{
    size_t n = strnlen(src, len - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static void read_topology(struct rdma_nic *n, struct ibv_device *dev)
{
    char path[PATH_MAX], real[PATH_MAX];
    snprintf(path, sizeof(path), "%s/device", dev->ibdev_path);
    n->desc.numa = -1;
    if (!realpath(path, real))
        return;
    copy_str(n->sysfs, sizeof(n->sysfs), real);
    const char *base = strrchr(real, '/');
    copy_str(n->desc.pci, sizeof(n->desc.pci), base ? base + 1 : real);
    snprintf(path, sizeof(path), "%s/device/numa_node", dev->ibdev_path);
    FILE *f = fopen(path, "r");
    if (f) {
        if (fscanf(f, "%d", &n->desc.numa) != 1)
            n->desc.numa = -1;
        fclose(f);
    }
}

static bool device_wanted(const char *name)
{
    const char *only = getenv("XFER_RDMA_DEVICES"); /* "mlx5_0,mlx5_3" */
    if (!only || !*only)
        return true;
    size_t l = strlen(name);
    for (const char *p = only; *p;) {
        size_t n = strcspn(p, ",");
        if (n == l && !strncmp(p, name, l))
            return true;
        p += n + (p[n] == ',');
    }
    return false;
}

/* Whether `listen` lets a NIC with IPv4 address ip serve: a wildcard lets
 * every NIC, any other address only the NIC that has it (issue 18 item 6:
 * listening on loopback must not serve on the NIC). */
static bool listen_allows(const char *listen, uint32_t ip)
{
    if (!listen || !*listen || !strcmp(listen, "0.0.0.0") || !strcmp(listen, "::"))
        return true;
    struct in_addr a;
    return inet_pton(AF_INET, listen, &a) == 1 && a.s_addr == ip;
}

/* Fills n for an active port; false when the port is not usable or, with
 * *refused set, not at the listen address. */
static bool nic_init(struct rdma_transport *t, struct rdma_nic *n, struct ibv_context *c,
                     uint8_t port, const struct ibv_device_attr *da, bool *refused)
{
    struct ibv_port_attr pa;
    union ibv_gid gid;
    if (ibv_query_port(c, port, &pa) || pa.state != IBV_PORT_ACTIVE)
        return false;
    int gi = choose_gid(c, port, &pa, &gid);
    if (gi < 0) {
        xfer_warn("rdma: %s port %u: no usable GID", ibv_get_device_name(c->device), port);
        return false;
    }
    memset(n, 0, sizeof(*n));
    n->tag = TAG_LISTENER;
    n->ctx = c;
    snprintf(n->desc.name, sizeof(n->desc.name), "%s", ibv_get_device_name(c->device));
    n->desc.port = port;
    n->desc.gid = gid;
    n->desc.ib = pa.link_layer != IBV_LINK_LAYER_ETHERNET;
    n->desc.gbps = port_gbps(&pa);
    n->gid_index = gi;
    n->mtu = pa.active_mtu;
    n->max_qp_wr = (uint32_t)da->max_qp_wr;
    n->mw2 = da->max_mw > 0 && (da->device_cap_flags &
                                (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B));
    n->rd_atom = (uint8_t)(da->max_qp_rd_atom < 16 ? da->max_qp_rd_atom : 16);
    n->max_msg = pa.max_msg_sz;
    read_topology(n, c->device);
    /* RoCE v2: the GID is the NIC's IP; InfiniBand: IPoIB at listen_addr. */
    uint32_t ip;
    struct sockaddr_in *sin = (struct sockaddr_in *)&n->addr;
    sin->sin_family = AF_INET;
    if (xfer_rdma_gid_ipv4(&gid, &ip) && !listen_allows(t->cfg->listen_addr, ip)) {
        char have[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &ip, have, sizeof(have));
        xfer_info("rdma: %s port %u (%s) not offered: listen is %s", n->desc.name, port, have,
                  t->cfg->listen_addr);
        *refused = true;
        return false;
    }
    if (xfer_rdma_gid_ipv4(&gid, &ip))
        sin->sin_addr.s_addr = ip;
    else if (inet_pton(AF_INET, t->cfg->listen_addr ? t->cfg->listen_addr : "0.0.0.0",
                       &sin->sin_addr) != 1)
        return false;
    return true;
}

int xrdma_devices_open(struct rdma_transport *t, char *why, size_t why_len)
{
    int n = 0;
    bool refused = false;
    t->dev_list = rdma_get_devices(&n);
    if (!t->dev_list || n == 0) {
        snprintf(why, why_len, "no RDMA device (%s)", strerror(errno));
        return -XFER_ENODEV;
    }
    for (int i = 0; i < n && t->n_nics < XFER_RDMA_MAX_NICS; i++) {
        struct ibv_context *c = t->dev_list[i];
        struct ibv_device_attr da;
        if (!device_wanted(ibv_get_device_name(c->device)) || ibv_query_device(c, &da))
            continue;
        for (uint8_t p = 1; p <= da.phys_port_cnt && t->n_nics < XFER_RDMA_MAX_NICS; p++) {
            struct rdma_nic *nic = &t->nics[t->n_nics];
            if (!nic_init(t, nic, c, p, &da, &refused))
                continue;
            nic->index = t->n_nics;
            nic->pd = ibv_alloc_pd(c);
            nic->msg_ch = nic->pd ? ibv_create_comp_channel(c) : NULL;
            nic->msg_cq =
                nic->msg_ch
                    ? ibv_create_cq(c,
                                    RDMA_MSG_CQ_DEPTH < da.max_cqe ? RDMA_MSG_CQ_DEPTH : da.max_cqe,
                                    NULL, nic->msg_ch, 0)
                    : NULL;
            if (nic->msg_cq)
                ibv_req_notify_cq(nic->msg_cq, 0);
            if (!nic->msg_cq) {
                snprintf(why, why_len, "rdma: %s: cannot allocate PD/CQ: %s", nic->desc.name,
                         strerror(errno));
                return -XFER_EIO;
            }
            xfer_info("rdma: NIC %s port %u gid[%d] %s mtu %d %u Gb/s pci %s numa %d",
                      nic->desc.name, p, nic->gid_index, nic->desc.ib ? "ib" : "roce",
                      128 << nic->mtu, nic->desc.gbps, nic->desc.pci[0] ? nic->desc.pci : "-",
                      nic->desc.numa);
            t->n_nics++;
        }
    }
    if (t->n_nics == 0 && refused) {
        snprintf(why, why_len, "no RDMA NIC has the listen address %s (0.0.0.0 offers every NIC)",
                 t->cfg->listen_addr);
        return -XFER_ENODEV;
    }
    if (t->n_nics == 0) {
        snprintf(why, why_len, "no RDMA device with an active port and a usable GID");
        return -XFER_ENODEV;
    }
    return 0;
}

void xrdma_devices_close(struct rdma_transport *t)
{
    for (int i = 0; i < t->n_nics; i++) {
        if (t->nics[i].msg_cq)
            ibv_destroy_cq(t->nics[i].msg_cq);
        if (t->nics[i].msg_ch)
            ibv_destroy_comp_channel(t->nics[i].msg_ch);
        if (t->nics[i].pd)
            ibv_dealloc_pd(t->nics[i].pd);
    }
    t->n_nics = 0;
    if (t->dev_list)
        rdma_free_devices(t->dev_list);
    t->dev_list = NULL;
}

/* sysfs path of a CUDA device's PCI function, "" when unknown. */
static void gpu_sysfs(int dev, char *out, size_t len)
{
    out[0] = '\0';
#if XFER_WITH_CUDA
    char bus[32], path[PATH_MAX], real[PATH_MAX];
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), dev) != cudaSuccess)
        return;
    for (char *p = bus; *p; p++)
        *p = (char)(*p >= 'A' && *p <= 'F' ? *p - 'A' + 'a' : *p);
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s", bus);
    if (realpath(path, real))
        copy_str(out, len, real);
#else
    (void)dev, (void)len;
#endif
}

uint32_t xrdma_nics_near(struct rdma_transport *t, int cuda_device)
{
    uint32_t all = (1u << t->n_nics) - 1;
    if (cuda_device < 0)
        return all;
    char gpu[PATH_MAX];
    gpu_sysfs(cuda_device, gpu, sizeof(gpu));
    if (!gpu[0])
        return all;
    int best = INT_MAX;
    uint32_t mask = 0;
    for (int i = 0; i < t->n_nics; i++) {
        int d = xfer_rdma_pci_distance(gpu, t->nics[i].sysfs);
        if (d < best) {
            best = d;
            mask = 0;
        }
        if (d == best)
            mask |= 1u << i;
    }
    return mask ? mask : all;
}
