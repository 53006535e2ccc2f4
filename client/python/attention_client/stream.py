"""ExtendStream from Python with several steps in flight (AttentionClient.extend_stream).

    with client.extend_stream(max_in_flight=3) as st:
        f1 = st.submit(seq_a, layer, None, q1, k1, v1)   # returns at once
        f2 = st.submit(seq_b, layer, None, q2, k2, v2)
        r1, r2 = f1.result(), f2.result()                # ExtendResult, or raises

The server answers each request message of a stream with exactly one ExtendResult, in order,
so replies are matched to steps by their order (a FIFO of pending steps; no tag on the wire).
One reader thread takes the replies. A failing step raises its AttentionError from its
future's result() and the stream goes on; a failing stream (deadline, server gone, cancelled)
fails every pending future and every later submit with that error.
"""
import collections
import concurrent.futures
import queue
import threading

import grpc

from .errors import InvalidArgument, Unavailable, from_rpc_error

_END = object()


class ExtendStream:
    """One open ExtendStream call (use as a context manager, or call close()).

    submit(sequence, layer, position, q, k, v, *, fast=None) → concurrent.futures.Future of
    ExtendResult; blocks while max_in_flight steps are unanswered. position None: the
    handle's length, advanced at submit time by T so that steps submitted back to back on
    one layer line up (the reply sets it to the server's length). fast: as in
    AttentionClient.extend_batch (one step per message: each step's tensors are gathered and
    its o scattered on their own).
    extend(...) = submit(...).result().
    close(): half-closes the stream and waits for the replies still due (their futures
    resolve); idempotent.
    """

    def __init__(self, client, *, timeout, max_in_flight=3):
        if int(max_in_flight) < 1:
            raise InvalidArgument(f"max_in_flight must be >= 1, got {max_in_flight}")
        self._client = client
        self._requests = queue.Queue()
        self._pending = collections.deque()
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(int(max_in_flight))
        self._error = None
        self._closed = False
        self._raw = bool(client.wire)  # wire path: bytes both ways (requests of any path)
        opener = (client._raw_call("ExtendStream", "stream_stream") if self._raw
                  else client._seq.ExtendStream)
        self._call = opener(iter(self._requests.get, _END), timeout=timeout,
                            metadata=client._metadata())
        self._reader = threading.Thread(target=self._read, name="attn-extend-stream",
                                        daemon=True)
        self._reader.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _read(self):
        try:
            for r in self._call:
                with self._lock:
                    fut, step, p = self._pending.popleft()
                self._slots.release()
                try:
                    fut.set_result(self._finish(step, p, r))
                except Exception as e:  # a step-level failure or a bad reply
                    fut.set_exception(e)
            err = None if self._closed else Unavailable("ExtendStream ended by the server", None)
        except grpc.RpcError as e:
            err = from_rpc_error(e, "ExtendStream")
        self._fail_all(err)

    def _fail_all(self, err):
        with self._lock:
            self._error = self._error or err or Unavailable("ExtendStream closed", None)
            pending, self._pending = list(self._pending), collections.deque()
        for fut, _, _ in pending:
            fut.set_exception(self._error)
            self._slots.release()

    def _finish(self, step, p, r):
        return self._client._stream_result(step, p, r)

    def submit(self, sequence, layer, position, q, k, v, *, fast=None):
        """Sends one step; → Future of ExtendResult (see the class docstring)."""
        c = self._client
        position = c._position(sequence, layer, position)
        step = (sequence, layer, position, q, k, v)
        p = c._plan([step], fast)
        req = c._step_request(step, p, raw=self._raw)
        self._slots.acquire()
        fut = concurrent.futures.Future()
        with self._lock:
            if self._error is not None or self._closed:
                self._slots.release()
                raise self._error or InvalidArgument("ExtendStream is closed", None)
            self._pending.append((fut, step, p))
            sequence._lengths[int(layer)] = position + int(q.shape[0])
            self._requests.put(req)
        return fut

    def extend(self, sequence, layer, position, q, k, v, *, fast=None, timeout=None):
        """submit(...).result(timeout)."""
        return self.submit(sequence, layer, position, q, k, v, fast=fast).result(timeout)

    def close(self, timeout=None):
        """Half-closes the stream; waits (up to timeout s) for the replies still due."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._requests.put(_END)
        self._reader.join(timeout)
        if self._reader.is_alive():
            self._call.cancel()
            self._reader.join()
