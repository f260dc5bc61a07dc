/* libFuzzer target: the data header decoder and the handshake message
 * unpackers must accept or refuse any byte string without crashing, and what
 * they accept must re-encode to a header that decodes the same. */
#include <stdint.h>
#include <string.h>

#include "hs_msg.h"
#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size >= XFER_WIRE_HDR_LEN) {
        struct xfer_wire_hdr h, again;
        if (xfer_wire_decode(data, 1u << 24, &h) == 0) {
            uint8_t buf[XFER_WIRE_HDR_LEN];
            xfer_wire_encode(&h, buf);
            if (xfer_wire_decode(buf, 1u << 24, &again) != 0 || memcmp(buf, data, sizeof(buf)))
                __builtin_trap();
        }
    }
    struct xfer_hs_hello hello;
    struct xfer_hs_auth auth;
    struct xfer_hs_result res;
    (void)xfer_hs_hello_unpack(data, size, &hello);
    (void)xfer_hs_auth_unpack(data, size, &auth);
    (void)xfer_hs_result_unpack(data, size, &res);
    return 0;
}
