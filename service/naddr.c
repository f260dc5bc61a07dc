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
