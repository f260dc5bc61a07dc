/* Names of the fleet: "node/region[+off]", "node/region#block", and sizes
 * with binary-unit suffixes. */
#include "xfer_node.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int xfer_node_parse_size(const char *s, uint64_t *out)
{
    char *end;
    if (!s || !*s || *s == '-')
        return -XFER_EINVAL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s)
        return -XFER_EINVAL;
    unsigned shift = 0;
    switch (toupper((unsigned char)*end)) {
    case 0:
        break;
    case 'K':
        shift = 10;
        break;
    case 'M':
        shift = 20;
        break;
    case 'G':
        shift = 30;
        break;
    case 'T':
        shift = 40;
        break;
    default:
        return -XFER_EINVAL;
    }
    if (*end) {
        end++;
        if (toupper((unsigned char)*end) == 'I')
            end++;
        if (toupper((unsigned char)*end) == 'B')
            end++;
        if (*end)
            return -XFER_EINVAL;
    }
    if (shift && v > (UINT64_MAX >> shift))
        return -XFER_ERANGE;
    *out = (uint64_t)v << shift;
    return 0;
}

static int bad(char *why, size_t wl, const char *fmt, const char *s)
{
    if (why && wl)
        snprintf(why, wl, fmt, s);
    return -XFER_EINVAL;
}

int xfer_node_addr_parse(const char *s, struct xfer_node_addr *out, char *why, size_t wl)
{
    memset(out, 0, sizeof(*out));
    const char *slash = s ? strchr(s, '/') : NULL;
    if (!slash || slash == s || (size_t)(slash - s) >= XFER_NAME_MAX)
        return bad(why, wl, "bad address '%s' (want NODE/REGION[+OFF])", s ? s : "");
    memcpy(out->node, s, (size_t)(slash - s));
    const char *name = slash + 1;
    size_t n = strcspn(name, "+#");
    if (n == 0 || n >= XFER_NAME_MAX || strchr(name, '/'))
        return bad(why, wl, "bad region in '%s'", s);
    memcpy(out->region, name, n);
    if (name[n] && xfer_node_parse_size(name + n + 1, &out->off))
        return bad(why, wl, "bad offset in '%s'", s);
    out->is_block = name[n] == '#';
    return 0;
}
