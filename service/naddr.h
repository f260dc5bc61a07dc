/*
 * Named addresses of the control API: "node/region[+off]" (byte offset,
 * decimal, hex or with a K/M/G suffix) or "node/region#block" (block index
 * of a region with a typed layout).
 */
#ifndef XFER_SERVICE_NADDR_H
#define XFER_SERVICE_NADDR_H

#include "xfer.h"

#include <stdbool.h>
#include <stdint.h>

struct naddr {
    char node[XFER_NAME_MAX];
    char region[XFER_NAME_MAX];
    uint64_t off; /* bytes, or the block index when is_block */
    bool is_block;
};

/* 0 or -XFER_EINVAL with the reason in why. */
int naddr_parse(const char *s, struct naddr *out, char *why, size_t why_len);
/* Block sizes and layout checks of NODE/REGION#B addresses are the engine's:
 * xfer_layout_block_size() and xfer_layouts_match() (engine/blocks.c). */

#endif
