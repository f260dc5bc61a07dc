/*
 * Growing arrays: the one doubling realloc that the engine, its transports
 * and the node library use for their append-only arrays (batch items,
 * segments, names; lease rules; staging parts; frame buffers). Not part of
 * libxfer.so's API: named xfer_ like xfer_io.h so that node/ may use it.
 */
#ifndef XFER_GROW_H
#define XFER_GROW_H

#include <stddef.h>

/* Makes the array *v, of *cap elements of each bytes, hold at least want
 * elements: the capacity doubles from *cap (from first when *cap is 0), so
 * n appends cost O(n). 0, or -XFER_ENOMEM (realloc failed or want * each
 * overflows), when *v and *cap are unchanged. Elements past the old *cap
 * are uninitialized; the caller frees *v. */
int xfer_grow(void **v, size_t *cap, size_t want, size_t each, size_t first);

#endif
