/* Engine-internal name of the handshake API; the declarations are public
 * (engine/xfer_handshake.h) since xferd's control port speaks it too. */
#ifndef XFER_HANDSHAKE_H
#define XFER_HANDSHAKE_H

#include "xfer_handshake.h"

#endif
