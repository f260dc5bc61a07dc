/* Named addresses "node/region[+off]" and "node/region#block". */
#include "naddr.h"
#include "config.h"

#include <stdio.h>
#include <string.h>

int naddr_parse(const char *s, struct naddr *out, char *why, size_t why_len)
{
    memset(out, 0, sizeof(*out));
    const char *slash = s ? strchr(s, '/') : NULL;
    if (!slash || slash == s || (size_t)(slash - s) >= XFER_NAME_MAX) {
        snprintf(why, why_len, "bad address '%s' (want NODE/REGION[+OFF])", s ? s : "");
        return -XFER_EINVAL;
    }
    memcpy(out->node, s, (size_t)(slash - s));
    const char *name = slash + 1;
    size_t n = strcspn(name, "+#");
    if (n == 0 || n >= XFER_NAME_MAX || strchr(name, '/')) {
        snprintf(why, why_len, "bad region in '%s'", s);
        return -XFER_EINVAL;
    }
    memcpy(out->region, name, n);
    if (name[n] && xferd_parse_size(name + n + 1, &out->off)) {
        snprintf(why, why_len, "bad offset in '%s'", s);
        return -XFER_EINVAL;
    }
    out->is_block = name[n] == '#';
    return 0;
}

uint64_t naddr_block_size(const struct xfer_layout *l)
{
    return l->block_bytes * (l->layers ? l->layers : 1);
}

int naddr_layouts_match(const struct xfer_layout *a, const struct xfer_layout *b, char *why,
                        size_t why_len)
{
    if (!a->block_bytes || !b->block_bytes) {
        snprintf(why, why_len, "block address on a region without a layout");
        return -XFER_EMISMATCH;
    }
    if (strcmp(a->dtype, b->dtype)) {
        snprintf(why, why_len, "layouts disagree: dtype %s vs %s", a->dtype, b->dtype);
        return -XFER_EMISMATCH;
    }
    if (a->block_bytes != b->block_bytes || a->layers != b->layers) {
        snprintf(why, why_len, "layouts disagree: block_bytes/layers %llu/%u vs %llu/%u",
                 (unsigned long long)a->block_bytes, a->layers, (unsigned long long)b->block_bytes,
                 b->layers);
        return -XFER_EMISMATCH;
    }
    if (a->tag[0] && b->tag[0] && strcmp(a->tag, b->tag)) {
        snprintf(why, why_len, "layouts disagree: tag %s vs %s", a->tag, b->tag);
        return -XFER_EMISMATCH;
    }
    return 0;
}
