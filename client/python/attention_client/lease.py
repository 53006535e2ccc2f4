"""Lease: one SharedMemoryLease stream (sequence.proto) kept open on a background thread, shared
by SharedRegion (host shm) and CudaRegion (CUDA IPC).

The first (only) request names the region; the server answers once with the region id (and, for
CUDA IPC, its event's handle) and keeps the stream open: the region is leased while it is.
close() half-closes the stream and waits for its end: the server then has released the region
(for CUDA IPC: closed its mapping, after the last call that used it), so the caller may unlink
or free what it shared.
"""
import threading

from .errors import DeadlineExceeded, Unavailable, from_rpc_error


class Lease:
    """Lease(client, request, *, timeout=30.0): client an AttentionClient; request the
    SharedMemoryLeaseRequest; timeout: seconds to wait for the server's answer. Raises what the
    server refused the lease with (InvalidArgument, NotFound, PermissionDenied,
    FailedPrecondition, ResourceExhausted, Unimplemented, ...), DeadlineExceeded (no answer
    within timeout) or Unavailable (the stream ended unanswered).
    Attributes: response (the SharedMemoryLeaseResponse)."""

    def __init__(self, client, request, *, timeout=30.0):
        self.response = None
        self._error = None
        self._closed = False
        self._closing = threading.Event()
        self._ready = threading.Event()
        self._reader = None
        try:
            self._call = client._seq.SharedMemoryLease(self._requests(request), timeout=None,
                                                       metadata=client._metadata())
            self._reader = threading.Thread(target=self._read, name="attn-shm-lease",
                                            daemon=True)
            self._reader.start()
            if not self._ready.wait(timeout):
                raise DeadlineExceeded(f"SharedMemoryLease: no lease within {timeout} s",
                                       method="SharedMemoryLease")
            if self._error is not None:
                raise self._error
        except BaseException:
            self.close()
            raise

    def _requests(self, request):
        yield request
        self._closing.wait()

    def _read(self):
        try:
            for r in self._call:
                if self.response is None:
                    self.response = r
                    self._ready.set()
            if self.response is None:
                self._error = Unavailable("SharedMemoryLease ended before the region was "
                                          "leased", method="SharedMemoryLease")
        except Exception as e:  # grpc.RpcError (also CANCELLED after close)
            if not self._closing.is_set():
                self._error = from_rpc_error(e, "SharedMemoryLease")
        finally:
            self._ready.set()

    @property
    def alive(self):
        """True while the lease stream is open (the server holds the region)."""
        return (not self._closed and self._reader is not None and self._reader.is_alive()
                and self._error is None)

    def close(self, timeout=10.0):
        """Half-closes the stream and waits up to timeout s for its end; then cancels it (the
        server still releases the region, but the caller no longer knows when). Returns True
        when the stream ended on its own within timeout. Idempotent (later calls: True)."""
        if self._closed:
            return True
        self._closed = True
        self._closing.set()
        if self._reader is None:
            return True
        self._reader.join(timeout)
        if not self._reader.is_alive():
            return True
        self._call.cancel()
        self._reader.join()
        return False
