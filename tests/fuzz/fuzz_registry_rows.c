/* libFuzzer target: the registry's row parser. Anyone who can write to Redis
 * can write a row, so reg_parse_node/reg_parse_region must accept or refuse
 * any HGETALL reply without crashing. The input is split at NUL bytes into
 * strings that become the reply's field/value elements (a first byte picks
 * element types, so non-string elements are tried too). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "reg_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_ELEMS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t types = data[0];
    data++;
    size--;
    redisReply elems[MAX_ELEMS], *ptrs[MAX_ELEMS];
    char *strs[MAX_ELEMS];
    size_t n = 0, start = 0;
    for (size_t i = 0; i <= size && n < MAX_ELEMS; i++) {
        if (i < size && data[i] != 0)
            continue;
        size_t len = i - start;
        strs[n] = malloc(len + 1); /* exact size: ASan sees any overread */
        if (!strs[n])
            break;
        memcpy(strs[n], data + start, len);
        strs[n][len] = 0;
        memset(&elems[n], 0, sizeof(elems[n]));
        /* one element in eight (chosen by the type byte) is an integer */
        elems[n].type =
            ((types >> (n % 8)) & 1) && n % 3 == 2 ? REDIS_REPLY_INTEGER : REDIS_REPLY_STRING;
        elems[n].str = strs[n];
        elems[n].len = len;
        ptrs[n] = &elems[n];
        n++;
        start = i + 1;
    }
    redisReply rep = {.type = REDIS_REPLY_ARRAY, .elements = n, .element = ptrs};
    struct xfer_node_desc nd;
    struct xfer_region_desc rd;
    /* what is accepted is the node/region asked for, with its strings ended */
    if (reg_parse_node(&rep, "n1", &nd) == 0 &&
        (strcmp(nd.peer.node_id, "n1") || !memchr(nd.peer.addr, 0, sizeof(nd.peer.addr))))
        __builtin_trap();
    if (reg_parse_region(&rep, "n1", "kv", &rd) == 0 &&
        (strcmp(rd.name, "kv") || !memchr(rd.ipc, 0, sizeof(rd.ipc))))
        __builtin_trap();
    for (size_t i = 0; i < n; i++)
        free(strs[i]);
    return 0;
}
