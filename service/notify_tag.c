/*
 * xferd's tag on the notifications it binds to named transfers (copy
 * --notify, batch --notify; docs/service.md "Notifications"): 16 bytes in
 * front of the text, so that a copy xferd retries is delivered at most once.
 *
 *   0  4  magic "\0XFD" (a text from xferctl cannot start with NUL)
 *   4  1  version 1
 *   5  1  flags: bit 0 = a retry may follow (the sender retries a copy
 *         whose remote region was re-registered: -XFER_ESTALE)
 *   6  2  0
 *   8  8  copy id (little-endian), unique per sending xferd incarnation
 *
 * The receiving xferd strips the tag before listeners see the text, drops a
 * notification that says a retry may follow and failed with -XFER_ESTALE
 * (the sender's retry, sent with the same id, is the one delivered), and
 * drops one whose (sender, incarnation, copy id) it already delivered.
 * Untagged notifications (xferctl notify, engines that are not xferd) pass
 * as they are.
 */
#include "notify_tag.h"

#include <stdatomic.h>
#include <string.h>

static const uint8_t tag_magic[4] = {0, 'X', 'F', 'D'};
static atomic_uint_fast64_t next_id = 1;

uint64_t notify_tag_id(void)
{
    return atomic_fetch_add(&next_id, 1);
}

void notify_tag_put(uint8_t *out, uint64_t id, unsigned flags)
{
    memset(out, 0, NOTIFY_TAG_LEN);
    memcpy(out, tag_magic, 4);
    out[4] = 1;
    out[5] = (uint8_t)flags;
    for (int i = 0; i < 8; i++)
        out[8 + i] = (uint8_t)(id >> (8 * i));
}

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static bool seen(const struct notify_seen *s, const struct notify_seen_key *k)
{
    for (unsigned i = 0; i < s->n; i++)
        if (!memcmp(&s->keys[i], k, sizeof(*k)))
            return true;
    return false;
}

bool notify_tag_filter(struct notify_seen *s, struct xfer_notif *n)
{
    if (n->len < NOTIFY_TAG_LEN || memcmp(n->data, tag_magic, 4) || n->data[4] != 1)
        return true;
    struct notify_seen_key k = {name_hash(n->node_id), n->incarnation, 0};
    for (int i = 0; i < 8; i++)
        k.id |= (uint64_t)n->data[8 + i] << (8 * i);
    unsigned flags = n->data[5];
    n->data += NOTIFY_TAG_LEN;
    n->len -= NOTIFY_TAG_LEN;
    if ((flags & NOTIFY_TAG_MAY_RETRY) && n->status == -XFER_ESTALE) {
        xfer_info("notification %llu from %s: stale attempt, its retry is the one delivered",
                  (unsigned long long)k.id, n->node_id);
        return false;
    }
    if (seen(s, &k)) {
        xfer_info("notification %llu from %s delivered already: the copy's retry is dropped",
                  (unsigned long long)k.id, n->node_id);
        return false;
    }
    s->keys[s->next] = k;
    s->next = (s->next + 1) % NOTIFY_SEEN_MAX;
    if (s->n < NOTIFY_SEEN_MAX)
        s->n++;
    return true;
}
