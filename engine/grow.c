/* Growing arrays (xfer_grow.h). */
#include "xfer_grow.h"

#include "xfer_err.h"

#include <stdint.h>
#include <stdlib.h>

int xfer_grow(void **v, size_t *cap, size_t want, size_t each, size_t first)
{
    if (want <= *cap)
        return 0;
    size_t n = *cap ? *cap : first ? first : 1;
    while (n < want) {
        if (n > SIZE_MAX / 2)
            return -XFER_ENOMEM;
        n *= 2;
    }
    if (each && n > SIZE_MAX / each)
        return -XFER_ENOMEM;
    void *w = realloc(*v, n * each);
    if (!w)
        return -XFER_ENOMEM;
    *v = w;
    *cap = n;
    return 0;
}
