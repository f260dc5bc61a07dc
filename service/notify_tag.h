/* xferd's tag on notifications bound to named transfers (notify_tag.c). */
#ifndef XFER_SERVICE_NOTIFY_TAG_H
#define XFER_SERVICE_NOTIFY_TAG_H

#include "xfer.h"

#include <stdbool.h>
#include <stdint.h>

#define NOTIFY_TAG_LEN       16u
#define NOTIFY_TAG_MAY_RETRY 1u    /* a retry of a stale attempt may follow */
#define NOTIFY_SEEN_MAX      1024u /* tagged notifications remembered per xferd */
/* Text of copy --notify / batch --notify: the engine's limit less the tag. */
#define XFERD_NOTIFY_MAX (XFER_NOTIFY_MAX - NOTIFY_TAG_LEN)

/* A fresh copy id of this xferd (the same for every attempt of a copy). */
uint64_t notify_tag_id(void);
/* Writes the NOTIFY_TAG_LEN tag bytes to out. */
void notify_tag_put(uint8_t *out, uint64_t id, unsigned flags);

struct notify_seen_key {
    uint64_t node, incarnation, id;
};
/* The last NOTIFY_SEEN_MAX tagged notifications delivered (zeroed). */
struct notify_seen {
    struct notify_seen_key keys[NOTIFY_SEEN_MAX];
    unsigned n, next;
};
/* true: deliver n (its tag, if any, is stripped from n->data); false: a
 * stale attempt or a duplicate, the caller frees it. */
bool notify_tag_filter(struct notify_seen *s, struct xfer_notif *n);

#endif
