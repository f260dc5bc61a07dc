# Helper programs the integration tests start (build/tests/<name>).
TEST_PROGS += xfer_node:tests/prog/xfer_node.c
TEST_PROGS += xfer_random:tests/prog/xfer_random.c
TEST_PROGS += xfer_vec:tests/prog/xfer_vec.c
TEST_PROGS += xfer_blocks:tests/prog/xfer_blocks.c
TEST_PROGS += xfer_raw:tests/prog/xfer_raw.c
TEST_PROGS += xfer_retry:tests/prog/xfer_retry.c
TEST_PROGS += xfer_notify:tests/prog/xfer_notify.c
TEST_PROGS += xfer_sendrecv:tests/prog/xfer_sendrecv.c
TEST_PROGS += gpu_xfer:tests/gpu/gpu_xfer.c
TEST_PROGS += gpu_flood:tests/gpu/gpu_flood.c
TEST_PROGS += xfer_ring_node:tests/prog/xfer_ring_node.c
TEST_PROGS += node_lib:tests/prog/node_lib.c
TEST_PROGS += ctl_abuse:tests/prog/ctl_abuse.c
TEST_PROGS += node_pools:tests/prog/node_pools.c
TEST_PROGS += node_lease:tests/prog/node_lease.c
