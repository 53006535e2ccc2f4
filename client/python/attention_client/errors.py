"""Typed exceptions for attention-server calls, one per gRPC status code.

Every exception raised for a failed RPC is an :class:`AttentionError` subclass chosen from the
call's ``grpc.StatusCode`` (see :data:`STATUS_TO_ERROR`); it keeps the server's message in
``.details`` (also ``str(err)``), the code in ``.code`` and the RPC in ``.method``. The server
documents its codes in proto/attention/v1/*.proto: INVALID_ARGUMENT names the field, the
expected and the actual value; FAILED_PRECONDITION says why a named backend cannot run the
input, or (SequenceService) gives the layer's actual length; RESOURCE_EXHAUSTED says which
limit; NOT_FOUND is an unknown/released/foreign sequence.

Some classes also derive from the matching Python builtin, so generic handlers work:
InvalidArgument is a ValueError, DeadlineExceeded a TimeoutError, Unavailable a
ConnectionError, NotFound a LookupError. Client-side validation failures (e.g. an unsupported
numpy dtype) raise InvalidArgument with ``code = grpc.StatusCode.INVALID_ARGUMENT`` and
``method = None`` before anything is sent.
"""
import grpc


class AttentionError(Exception):
    """Base class. Attributes: code (grpc.StatusCode or None), details (str, the server's
    message), method (the RPC name, e.g. "Attend", or None for client-side checks)."""

    def __init__(self, details, code=None, method=None):
        super().__init__(details)
        self.details = details
        self.code = code
        self.method = method

    def __str__(self):
        name = self.code.name if self.code is not None else "CLIENT"
        where = f" in {self.method}" if self.method else ""
        return f"{name}{where}: {self.details}"


class Cancelled(AttentionError):
    """CANCELLED: the call was cancelled before it started computing."""


class Unknown(AttentionError):
    """UNKNOWN."""


class InvalidArgument(AttentionError, ValueError):
    """INVALID_ARGUMENT: shapes, dtypes, byte sizes, head counts, lengths, unknown backend..."""


class DeadlineExceeded(AttentionError, TimeoutError):
    """DEADLINE_EXCEEDED: the deadline (client ``timeout``, seconds) passed before computing."""


class NotFound(AttentionError, LookupError):
    """NOT_FOUND: unknown, released, evicted, expired or another identity's sequence."""


class AlreadyExists(AttentionError):
    """ALREADY_EXISTS."""


class PermissionDenied(AttentionError):
    """PERMISSION_DENIED."""


class ResourceExhausted(AttentionError):
    """RESOURCE_EXHAUSTED: message too large, queue full, device pool or KV cache full."""


class FailedPrecondition(AttentionError):
    """FAILED_PRECONDITION: a named backend cannot run the input, or an Extend position is not
    the layer's current length (the message gives the length)."""


class Aborted(AttentionError):
    """ABORTED."""


class OutOfRange(AttentionError):
    """OUT_OF_RANGE."""


class Unimplemented(AttentionError):
    """UNIMPLEMENTED: the server does not offer this RPC."""


class Internal(AttentionError):
    """INTERNAL: device fault (the server then reports NOT_SERVING on health)."""


class Unavailable(AttentionError, ConnectionError):
    """UNAVAILABLE: server draining for shutdown, or not reachable."""


class DataLoss(AttentionError):
    """DATA_LOSS."""


class Unauthenticated(AttentionError):
    """UNAUTHENTICATED."""


STATUS_TO_ERROR = {
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.UNKNOWN: Unknown,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DATA_LOSS: DataLoss,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
}

_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


def from_rpc_error(err, method=None):
    """grpc.RpcError → the matching AttentionError subclass (message kept)."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    return STATUS_TO_ERROR.get(code, AttentionError)(details or "", code, method)


def from_code(number, details, method=None):
    """A numeric google.rpc code (as in ExtendResult.code) → AttentionError subclass."""
    code = _BY_NUMBER.get(number, grpc.StatusCode.UNKNOWN)
    return STATUS_TO_ERROR.get(code, AttentionError)(details, code, method)
