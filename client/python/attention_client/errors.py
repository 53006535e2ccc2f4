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

    default_code = None  # the subclass's status, for errors raised by the client itself

    def __init__(self, details, code=None, method=None):
        super().__init__(details)
        self.details = details
        self.code = code if code is not None else self.default_code
        self.method = method

    def __str__(self):
        name = self.code.name if self.code is not None else "CLIENT"
        where = f" in {self.method}" if self.method else ""
        return f"{name}{where}: {self.details}"


class Cancelled(AttentionError):
    """CANCELLED: the call was cancelled before it started computing."""
    default_code = grpc.StatusCode.CANCELLED


class Unknown(AttentionError):
    """UNKNOWN."""
    default_code = grpc.StatusCode.UNKNOWN


class InvalidArgument(AttentionError, ValueError):
    """INVALID_ARGUMENT: shapes, dtypes, byte sizes, head counts, lengths, unknown backend..."""
    default_code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(AttentionError, TimeoutError):
    """DEADLINE_EXCEEDED: the deadline (client ``timeout``, seconds) passed before computing."""
    default_code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(AttentionError, LookupError):
    """NOT_FOUND: unknown, released, evicted, expired or another identity's sequence."""
    default_code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(AttentionError):
    """ALREADY_EXISTS."""
    default_code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(AttentionError):
    """PERMISSION_DENIED."""
    default_code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(AttentionError):
    """RESOURCE_EXHAUSTED: message too large, queue full, device pool or KV cache full."""
    default_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(AttentionError):
    """FAILED_PRECONDITION: a named backend cannot run the input, or an Extend position is not
    the layer's current length (the message gives the length)."""
    default_code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(AttentionError):
    """ABORTED."""
    default_code = grpc.StatusCode.ABORTED


class OutOfRange(AttentionError):
    """OUT_OF_RANGE."""
    default_code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(AttentionError):
    """UNIMPLEMENTED: the server does not offer this RPC."""
    default_code = grpc.StatusCode.UNIMPLEMENTED


class Internal(AttentionError):
    """INTERNAL: device fault (the server then reports NOT_SERVING on health)."""
    default_code = grpc.StatusCode.INTERNAL


class Unavailable(AttentionError, ConnectionError):
    """UNAVAILABLE: server draining for shutdown, or not reachable."""
    default_code = grpc.StatusCode.UNAVAILABLE


class DataLoss(AttentionError):
    """DATA_LOSS."""
    default_code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(AttentionError):
    """UNAUTHENTICATED."""
    default_code = grpc.StatusCode.UNAUTHENTICATED


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
