/*
 * Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/NAME/):
 * well-formed inputs of each decoder, so libFuzzer and the replay driver
 * start from inputs that reach past the first checks.
 *
 *   build/tests/fuzz_mkseeds tests/fuzz/corpus
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hs_msg.h"
#include "ipc/ipc.h"
#include "proto/control.pb-c.h"
#include "reg_internal.h"
#include "wire.h"

static const char *root;

static void put(const char *target, int n, const void *buf, size_t len)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", root, target);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "%s/%s/seed-%02d", root, target, n);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len || fclose(f)) {
        fprintf(stderr, "mkseeds: %s: %s\n", path, strerror(errno));
        exit(1);
    }
}

static void wire_seeds(void)
{
    struct xfer_wire_hdr h = {.version = 1,
                              .op = XFER_WIRE_WRITE_REQ,
                              .req_id = 7,
                              .region_id = 3,
                              .gen = 1,
                              .offset = 4096,
                              .length = 16,
                              .payload = 16};
    uint8_t buf[XFER_WIRE_HDR_LEN];
    xfer_wire_encode(&h, buf);
    put("wire", 0, buf, sizeof(buf));
    h.op = XFER_WIRE_READ_RESP;
    h.status = -XFER_ERANGE;
    h.payload = 0;
    xfer_wire_encode(&h, buf);
    put("wire", 1, buf, sizeof(buf));
    struct xfer_hs_hello hello = {.version = XFER_PROTO_VERSION,
                                  .node_id = "n1",
                                  .auth = true,
                                  .proof_len = XFER_HS_PROOF_LEN};
    uint8_t hb[XFER_HS_MSG_MAX];
    put("wire", 2, hb, (size_t)xfer_hs_hello_pack(&hello, hb, sizeof(hb)));
}

/* fuzz_ctl: request frame bodies, and handshake frames (2-byte lengths) */
static void ctl_request(int n, Xctl__Request *req)
{
    uint8_t buf[4096];
    size_t len = xctl__request__pack(req, buf);
    put("ctl", n, buf, len);
}

static void ctl_seeds(void)
{
    Xctl__Request req = XCTL__REQUEST__INIT;
    Xctl__Health health = XCTL__HEALTH__INIT;
    req.id = 1;
    req.body_case = XCTL__REQUEST__BODY_HEALTH;
    req.health = &health;
    ctl_request(0, &req);

    Xctl__Transfer t1 = XCTL__TRANSFER__INIT, t2 = XCTL__TRANSFER__INIT, *items[] = {&t1, &t2};
    t1.src = "n1/kv+4096";
    t1.dst = "n2/kv";
    t1.len = 1 << 20;
    t2.src = "n1/kv#7";
    t2.dst = "n2/kv#0";
    t2.len = 4096;
    Xctl__SubmitBatch b = XCTL__SUBMIT_BATCH__INIT;
    b.n_items = 2;
    b.items = items;
    b.async = true;
    req.body_case = XCTL__REQUEST__BODY_BATCH;
    req.batch = &b;
    ctl_request(1, &req);

    Xctl__WriteData w = XCTL__WRITE_DATA__INIT;
    w.dst = "n1/scratch+1M";
    w.data.data = (uint8_t *)"hello";
    w.data.len = 5;
    req.body_case = XCTL__REQUEST__BODY_WRITE;
    req.write = &w;
    ctl_request(2, &req);

    Xctl__ReadData r = XCTL__READ_DATA__INIT;
    r.src = "n2/kv+0x10";
    r.len = 64;
    req.body_case = XCTL__REQUEST__BODY_READ;
    req.read = &r;
    ctl_request(3, &req);

    Xctl__Layout l = XCTL__LAYOUT__INIT;
    l.dtype = "bf16";
    l.block_bytes = 4096;
    l.num_blocks = 16;
    l.tag = "llama";
    Xctl__RegisterRegion reg = XCTL__REGISTER_REGION__INIT;
    reg.name = "kv2";
    reg.len = 1 << 20;
    reg.access = "rw";
    reg.layout = &l;
    req.body_case = XCTL__REQUEST__BODY_REG;
    req.reg = &reg;
    ctl_request(4, &req);

    /* handshake: hello, then auth, each behind a 2-byte length */
    struct xfer_hs_hello hello = {
        .version = XFER_PROTO_VERSION, .node_id = "xferctl", .incarnation = 9, .auth = true};
    struct xfer_hs_auth auth = {.proof_len = XFER_HS_PROOF_LEN};
    uint8_t buf[2 * XFER_HS_MSG_MAX + 4];
    int a = xfer_hs_hello_pack(&hello, buf + 2, XFER_HS_MSG_MAX);
    buf[0] = (uint8_t)a;
    buf[1] = (uint8_t)(a >> 8);
    int b2 = xfer_hs_auth_pack(&auth, buf + 4 + a, XFER_HS_MSG_MAX);
    buf[2 + a] = (uint8_t)b2;
    buf[3 + a] = (uint8_t)(b2 >> 8);
    put("ctl", 5, buf, (size_t)(4 + a + b2));
    put("ctl", 6, buf, (size_t)(2 + a));
}

static void args_seed(const char *target, int n, const struct reg_args *a)
{
    char buf[8192];
    size_t len = 0;
    buf[len++] = 0; /* element types: all strings */
    for (int i = 0; i < a->argc; i++) {
        memcpy(buf + len, a->argv[i], a->len[i]);
        len += a->len[i];
        if (i + 1 < a->argc)
            buf[len++] = 0;
    }
    put(target, n, buf, len);
}

static void registry_seeds(void)
{
    struct reg_args a;
    struct xfer_node_desc nd;
    memset(&nd, 0, sizeof(nd));
    snprintf(nd.peer.node_id, sizeof(nd.peer.node_id), "n1");
    snprintf(nd.peer.addr, sizeof(nd.peer.addr), "10.0.0.1");
    nd.peer.data_port = 7400;
    nd.peer.transports = XFER_TRANSPORT_TCP | XFER_TRANSPORT_IPC;
    snprintf(nd.peer.host_id, sizeof(nd.peer.host_id), "0b5c9f5e-1c9a-4d55-a3f4-8f1d6f0e2a11");
    nd.peer.incarnation = 1234567890123ull;
    nd.ctrl_port = 7401;
    nd.pid = 42;
    snprintf(nd.version, sizeof(nd.version), "0.1");
    reg_args_reset(&a);
    reg_args_node_fields(&a, &nd);
    args_seed("registry_rows", 0, &a);

    struct xfer_region_desc rd;
    memset(&rd, 0, sizeof(rd));
    snprintf(rd.name, sizeof(rd.name), "kv");
    rd.id = 3;
    rd.gen = 1;
    rd.kind = XFER_MEM_HOST;
    rd.device = -1;
    rd.addr = 0x7f0000000000ull;
    rd.len = 1 << 20;
    rd.access = XFER_ACCESS_RW;
    snprintf(rd.layout.dtype, sizeof(rd.layout.dtype), "bf16");
    rd.layout.block_bytes = 4096;
    rd.layout.num_blocks = 256;
    reg_args_reset(&a);
    reg_args_region_fields(&a, &rd, 1700000000000ull);
    args_seed("registry_rows", 1, &a);
    rd.kind = XFER_MEM_CUDA;
    rd.device = 1;
    snprintf(rd.ipc, sizeof(rd.ipc), "cuda:00ff");
    reg_args_reset(&a);
    reg_args_region_fields(&a, &rd, 1700000000000ull);
    args_seed("registry_rows", 2, &a);
}

static size_t ipc_msg(uint8_t *out, uint16_t type, uint32_t count, const void *p, uint32_t bytes)
{
    struct ipc_hdr h = {
        .magic = IPC_MAGIC, .type = type, .version = IPC_VERSION, .count = count, .bytes = bytes};
    memcpy(out, &h, sizeof(h));
    memcpy(out + sizeof(h), p, bytes);
    return sizeof(h) + bytes;
}

static void ipc_seeds(void)
{
    uint8_t buf[8192];
    size_t n = 0;
    struct ipc_hello hello = {.pid = 1, .probe_len = sizeof(hello.probe_cookie)};
    n += ipc_msg(buf + n, IPC_HELLO, 1, &hello, sizeof(hello));
    struct ipc_map_req mq = {.id = 3, .gen = 1, .op = XFER_OP_READ};
    n += ipc_msg(buf + n, IPC_MAP_REQ, 1, &mq, sizeof(mq));
    put("ipc", 0, buf, n);

    struct ipc_map_resp mr = {.mech = IPC_MECH_MEMFD, .access = XFER_ACCESS_RW, .len = 4096};
    n = ipc_msg(buf, IPC_MAP_RESP, 1, &mr, sizeof(mr));
    put("ipc", 1, buf, n);

    struct ipc_acq_req aq[2] = {{.id = 3, .gen = 1, .op = XFER_OP_WRITE, .off = 0, .len = 64},
                                {.id = 4, .gen = 2, .op = XFER_OP_READ, .off = 64, .len = 8}};
    n = ipc_msg(buf, IPC_ACQ_REQ, 2, aq, sizeof(aq));
    uint32_t slots[2] = {0, 1};
    n += ipc_msg(buf + n, IPC_REL, 2, slots, sizeof(slots));
    put("ipc", 2, buf, n);

    struct {
        struct ipc_acq_resp r[2];
        struct ipc_revoked gone[1];
    } ar = {{{0, 0}, {-XFER_ESTALE, 0}}, {{5, 1}}};
    n = ipc_msg(buf, IPC_ACQ_RESP, 2, &ar, sizeof(ar));
    put("ipc", 3, buf, n);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_mkseeds CORPUS_DIR\n");
        return 2;
    }
    root = argv[1];
    mkdir(root, 0755);
    wire_seeds();
    ctl_seeds();
    registry_seeds();
    ipc_seeds();
    return 0;
}
