/*
 * Length framing of control-plane messages (handshake, xferd's control API):
 * a 4-byte little-endian length, then that many bytes. Lengths above
 * XFER_FRAME_MAX are refused before any allocation. The blocking send and
 * receive with deadlines are the engine's (engine/xfer_io.h): proto/ holds
 * messages and their framing, no I/O.
 */
#ifndef XFER_FRAME_H
#define XFER_FRAME_H

#define XFER_FRAME_MAX (4u << 20) /* 4 MiB */

#endif
