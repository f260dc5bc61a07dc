"""Errors: every failing call raises an :class:`Error` subclass that carries
the library's ``XFER_E*`` code and the reason the library gave."""

from __future__ import annotations

import builtins
import enum

from . import _lib


class Code(enum.IntEnum):
    """The library's error codes (``enum xfer_err`` in xfer_err.h)."""

    OK = 0
    EINVAL = 1
    ENOMEM = 2
    ENOENT = 3
    EACCES = 4
    ERANGE = 5
    ESTALE = 6
    ETIMEDOUT = 7
    ECANCELED = 8
    ECONN = 9
    EPROTO = 10
    EAUTH = 11
    EIO = 12
    ENOTSUP = 13
    EINPROGRESS = 14
    ENODEV = 15
    EEXIST = 16
    EBUSY = 17
    EMISMATCH = 18
    ENOSPC = 19
    EUNAVAIL = 20
    ETRUNC = 21


class Error(Exception):
    """A failed xfer call.

    Attributes:
        code: the :class:`Code` (positive form of the C return value).
        reason: the library's explanation (its last-error text), may be "".
    """

    code: Code = Code.EIO

    def __init__(self, code: int, reason: str = "", what: str = ""):
        self.code = Code(abs(code)) if abs(code) in Code._value2member_map_ else Code.EIO
        self.reason = reason
        self.what = what
        head = f"{what}: " if what else ""
        text = _lib.text(_lib.strerror(-abs(code)))
        tail = f": {reason}" if reason and reason != text else ""
        super().__init__(f"{head}XFER_{self.code.name} ({text}){tail}")


class InvalidArgumentError(Error, ValueError):
    """XFER_EINVAL: bad argument."""


class OutOfMemoryError(Error, MemoryError):
    """XFER_ENOMEM."""


class NotFoundError(Error, LookupError):
    """XFER_ENOENT: unknown node, region or item."""


class AccessError(Error, PermissionError):
    """XFER_EACCES: the region's access mode forbids the operation."""


class RangeError(Error, IndexError):
    """XFER_ERANGE: offset/length outside the region."""


class StaleError(Error):
    """XFER_ESTALE: the region was re-registered or the node restarted."""


class TimeoutError(Error, builtins.TimeoutError):
    """XFER_ETIMEDOUT: a deadline passed."""


class CanceledError(Error):
    """XFER_ECANCELED: cancelled by the caller."""


class ConnectionError(Error, builtins.ConnectionError):
    """XFER_ECONN: connection to the peer failed or was lost."""


class ProtocolError(Error):
    """XFER_EPROTO: malformed or unexpected message."""


class AuthError(Error, PermissionError):
    """XFER_EAUTH: handshake authentication failed (secrets differ)."""


class DeviceIOError(Error, OSError):
    """XFER_EIO: local I/O or device error."""


class NotSupportedError(Error, NotImplementedError):
    """XFER_ENOTSUP: operation or transport not supported here."""


class InProgressError(Error):
    """XFER_EINPROGRESS: not finished yet."""


class NoDeviceError(Error):
    """XFER_ENODEV: no such device (e.g. no CUDA device)."""


class ExistsError(Error):
    """XFER_EEXIST: name already in use."""


class BusyError(Error):
    """XFER_EBUSY: resource in use."""


class MismatchError(Error):
    """XFER_EMISMATCH: the layouts of the two sides disagree."""


class NoSpaceError(Error):
    """XFER_ENOSPC: a fixed capacity is exhausted."""


class UnavailableError(Error):
    """XFER_EUNAVAIL: a service (Redis) is unreachable."""


class TruncatedError(Error):
    """XFER_ETRUNC: a message was longer than the posted receive buffer."""


_BY_CODE = {
    Code.EINVAL: InvalidArgumentError,
    Code.ENOMEM: OutOfMemoryError,
    Code.ENOENT: NotFoundError,
    Code.EACCES: AccessError,
    Code.ERANGE: RangeError,
    Code.ESTALE: StaleError,
    Code.ETIMEDOUT: TimeoutError,
    Code.ECANCELED: CanceledError,
    Code.ECONN: ConnectionError,
    Code.EPROTO: ProtocolError,
    Code.EAUTH: AuthError,
    Code.EIO: DeviceIOError,
    Code.ENOTSUP: NotSupportedError,
    Code.EINPROGRESS: InProgressError,
    Code.ENODEV: NoDeviceError,
    Code.EEXIST: ExistsError,
    Code.EBUSY: BusyError,
    Code.EMISMATCH: MismatchError,
    Code.ENOSPC: NoSpaceError,
    Code.EUNAVAIL: UnavailableError,
    Code.ETRUNC: TruncatedError,
}


def error_for(code: int, reason: str = "", what: str = "") -> Error:
    """The Error subclass instance for a (negative or positive) code."""
    cls = _BY_CODE.get(Code(abs(code)) if abs(code) in Code._value2member_map_ else Code.EIO, Error)
    return cls(code, reason, what)


def check(rc: int, reason_fn=None, what: str = "") -> int:
    """Returns rc when >= 0, else raises the matching Error with the reason
    read from reason_fn() (the handle's last error)."""
    if rc >= 0:
        return rc
    reason = reason_fn() if reason_fn else ""
    raise error_for(rc, reason, what)
