"""ExtendBatchStream from Python: packed batches in flight, replies matched by tag
(AttentionClient.batch_stream).

    with client.batch_stream(max_in_flight=2) as bs:
        fa = bs.submit(layer, steps_a, qa, ka, va)      # micro-batch a, returns at once
        fb = bs.submit(layer, steps_b, qb, kb, vb)      # micro-batch b, in flight together
        ra, rb = fa.result(), fb.result()               # PackedResult, or raises

Each submit sends one packed ExtendBatchRequest with a tag (the caller's, or the next of a
counter) and returns a concurrent.futures.Future. The server answers each request once, as
soon as it completes, so replies may come out of order; one reader thread matches them to the
pending batches by tag. A request-level error (what would fail a unary ExtendBatch: a
malformed tensor, an unknown region, a full queue) is carried in that reply and raised by that
batch's future only; the stream goes on. Per-step refusals are in PackedResult.steps, as in
extend_packed. A failing stream (deadline, server gone, cancelled) fails every pending future
and every later submit with that error.
"""
import concurrent.futures
import queue
import threading

import grpc

from .errors import Internal, InvalidArgument, Unavailable, from_rpc_error
from .extend_calls import Phases

_END = object()
_MAX_TAG = (1 << 64) - 1


class BatchStream:
    """One open ExtendBatchStream call (use as a context manager, or call close()).

    submit(layer, steps, q, k, v, *, append_only=False, region=None, tag=None, fast=None,
           callback=None, timings=None) → Future of PackedResult; the arguments as
    AttentionClient.extend_packed's. Blocks while max_in_flight batches are unanswered.
    tag: uint64 naming the batch in its reply (None: 1, 2, 3, ... per stream); a tag still in
    flight: InvalidArgument. position None in a step: the handle's length, advanced at
    submit time by T, so that batches submitted back to back on one layer line up (a reply
    never lowers a handle's length; after a refused step call seq.refresh()).
    callback: called with the future once it resolves (on the reader thread).
    A region (SharedRegion or CudaRegion) serves one batch at a time: give each batch in
    flight its own.
    extend(...) = submit(...).result().
    close(): half-closes the stream and waits for the replies still due (their futures
    resolve); idempotent.
    """

    def __init__(self, client, *, timeout, max_in_flight=2):
        if int(max_in_flight) < 1:
            raise InvalidArgument(f"max_in_flight must be >= 1, got {max_in_flight}")
        self._client = client
        self.max_in_flight = int(max_in_flight)
        self._requests = queue.Queue()
        self._pending = {}  # tag → (future, _Call, Phases)
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(self.max_in_flight)
        self._next_tag = 1
        self._error = None
        self._closed = False
        self._raw = bool(client.wire)
        opener = (client._raw_call("ExtendBatchStream", "stream_stream") if self._raw
                  else client._seq.ExtendBatchStream)
        self._call = opener(iter(self._requests.get, _END), timeout=timeout,
                            metadata=client._metadata())
        self._reader = threading.Thread(target=self._read, name="attn-batch-stream",
                                        daemon=True)
        self._reader.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def in_flight(self):
        """Batches submitted and not answered yet."""
        with self._lock:
            return len(self._pending)

    def _read(self):
        method = "ExtendBatchStream"
        try:
            for r in self._call:
                msg, data = self._client._packed_reply(r, method)
                with self._lock:
                    entry = self._pending.pop(int(msg.tag), None)
                if entry is None:
                    raise Internal(f"{method}: reply with tag {msg.tag}, which no batch in "
                                   "flight has", method=method)
                self._slots.release()
                fut, call, tm = entry
                if call.region is not None:
                    call.region._busy = False
                tm.lap("rpc_us")
                try:
                    fut.set_result(self._client._packed_finish(call, msg, data, method, tm,
                                                               stream=True))
                except Exception as e:  # a request-level error or a bad reply
                    fut.set_exception(e)
            err = None if self._closed else Unavailable(f"{method} ended by the server", None)
        except grpc.RpcError as e:
            err = from_rpc_error(e, method)
        except Exception as e:  # a malformed reply (Internal)
            err = e
            self._call.cancel()
        self._fail_all(err)

    def _fail_all(self, err):
        with self._lock:
            self._error = self._error or err or Unavailable("ExtendBatchStream closed", None)
            pending = [e for e in self._pending.values() if e is not None]
            self._pending = {}
        for fut, call, _ in pending:
            if call.region is not None:
                call.region._busy = False
            fut.set_exception(self._error)
            self._slots.release()

    def _take_tag(self, tag):
        if tag is None:
            while self._next_tag in self._pending:
                self._next_tag += 1
            tag, self._next_tag = self._next_tag, self._next_tag + 1
        tag = int(tag)
        if not 0 <= tag <= _MAX_TAG:
            raise InvalidArgument(f"tag must be a uint64, got {tag}")
        if tag in self._pending:
            raise InvalidArgument(f"tag {tag} is still in flight on this stream")
        return tag

    def submit(self, layer, steps, q, k, v, *, append_only=False, region=None, tag=None,
               fast=None, callback=None, timings=None):
        """Sends one packed batch; → Future of PackedResult (see the class docstring)."""
        c = self._client
        steps = [(s, c._position(s, layer, pos), n) for s, pos, n in steps]
        self._slots.acquire()
        with self._lock:
            if self._error is not None or self._closed:
                self._slots.release()
                raise self._error or InvalidArgument("ExtendBatchStream is closed", None)
            try:
                tag = self._take_tag(tag)
            except BaseException:
                self._slots.release()
                raise
            self._pending[tag] = None  # reserved while the request is built (outside the lock)
        try:
            tm = Phases(timings)
            call, req = c._packed_request(layer, steps, q, k, v, append_only, region, fast,
                                          tag, tm, raw=self._raw)
        except BaseException:
            with self._lock:
                self._pending.pop(tag, None)
            self._slots.release()
            raise
        fut = concurrent.futures.Future()
        if callback is not None:
            fut.add_done_callback(callback)
        with self._lock:
            if self._error is not None:  # the stream failed while this one was built
                self._pending.pop(tag, None)
                if region is not None:
                    region._busy = False
                self._slots.release()
                raise self._error
            self._pending[tag] = (fut, call, tm)
            for seq, pos, n in steps:
                if 0 <= int(layer) < len(seq._lengths):  # (else the server refuses it)
                    seq._lengths[int(layer)] = pos + int(n)
            self._requests.put(req)
        return fut

    def extend(self, layer, steps, q, k, v, *, timeout=None, **kw):
        """submit(...).result(timeout)."""
        return self.submit(layer, steps, q, k, v, **kw).result(timeout)

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
