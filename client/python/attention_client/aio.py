"""asyncio client (grpc.aio): AsyncAttentionClient, AsyncSequence, AsyncExtendStream.

    from attention_client.aio import AsyncAttentionClient
    async with AsyncAttentionClient("unix:/run/attn.sock") as c:
        r = await c.attend(q, k, v, causal="bottom_right")
        seq = await c.create_sequence(2, 8, 2, 64, dtype="bfloat16")
        results = await c.extend_batch([(seq, 0, None, q, k, v)])
        async with c.extend_stream() as st:
            f1 = await st.submit(seq, 1, None, q, k, v)  # sent; an asyncio.Future
            r1 = await f1
        await seq.release()

Same arguments, results, errors and fast path as the blocking AttentionClient (every RPC
method is a coroutine here); build_request is shared. Create and use it inside one running
event loop.
"""
import asyncio
import collections

import grpc

from ._pb import attention_pb2 as pb
from ._pb import sequence_pb2 as spb
from .client import AttentionClient
from .ecosystems import layout_hint
from .extend_calls import Phases
from .errors import InvalidArgument, NotFound, Unavailable, from_rpc_error
from .sequence import Sequence


class AsyncAttentionClient(AttentionClient):
    """AttentionClient over grpc.aio (constructor arguments as AttentionClient's; channel=,
    when given, must be a grpc.aio channel). Use as ``async with`` or ``await close()``."""

    @staticmethod
    def _make_channel(target, creds, opts):
        if creds is None:
            return grpc.aio.insecure_channel(target, options=opts)
        return grpc.aio.secure_channel(target, creds, options=opts)

    async def close(self):
        await self._channel.close()

    def __enter__(self):
        raise TypeError("use `async with AsyncAttentionClient(...)`")

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def _call(self, stub_method, name, request, timeout, identity=None):
        try:
            return await stub_method(request,
                                     timeout=self.timeout if timeout is None else timeout,
                                     metadata=self._metadata(identity))
        except grpc.RpcError as e:
            raise from_rpc_error(e, name) from None

    async def server_info(self, *, timeout=None):
        """GetServerInfo (see AttentionClient.server_info)."""
        return await self._call(self._attn.GetServerInfo, "GetServerInfo",
                                pb.GetServerInfoRequest(), timeout)

    async def load(self, *, timeout=None):
        """GetLoad (see AttentionClient.load)."""
        return await self._call(self._attn.GetLoad, "GetLoad", pb.GetLoadRequest(), timeout)

    async def attend(self, q, k, v, *, causal=None, window=None, q_lengths=None,
                     kv_lengths=None, scale=None, backend=None, return_lse=False, varlen=None,
                     dtype=None, fp8=None, timeout=None):
        """Attend → AttendResult (see AttentionClient.attend)."""
        req = self.build_request(q, k, v, causal=causal, window=window, q_lengths=q_lengths,
                                 kv_lengths=kv_lengths, scale=scale, backend=backend,
                                 return_lse=return_lse, varlen=varlen, dtype=dtype, fp8=fp8)
        try:
            resp = await self._call(self._attn.Attend, "Attend", req, timeout)
        except InvalidArgument as e:  # (B,N,T,H) arrays: the message names the layout
            raise layout_hint(e, req) from None
        return self._attend_result(resp, q, return_lse)

    async def create_sequence(self, num_layers, num_heads, num_kv_heads, head_dim, *,
                              dtype="float32", kv_cache_dtype=None, reserve_tokens=0,
                              scale=None, k_scales=None, v_scales=None, timeout=None):
        """CreateSequence → AsyncSequence (see AttentionClient.create_sequence)."""
        req = self._create_request(num_layers, num_heads, num_kv_heads, head_dim, dtype,
                                   kv_cache_dtype, reserve_tokens, scale, k_scales, v_scales)
        resp = await self._call(self._seq.CreateSequence, "CreateSequence", req, timeout)
        return AsyncSequence(self, resp.sequence)

    async def sequence(self, sequence_id, *, timeout=None):
        """A handle on an existing sequence (GetSequence)."""
        resp = await self._call(self._seq.GetSequence, "GetSequence",
                                spb.GetSequenceRequest(sequence_id=sequence_id), timeout)
        return AsyncSequence(self, resp.sequence)

    async def extend_batch(self, steps, *, timeout=None, fast=None, timings=None):
        """ExtendBatch → list of ExtendResult or AttentionError (see
        AttentionClient.extend_batch)."""
        steps = list(steps)
        tm = Phases(timings)
        p = self._plan(steps, fast)
        req = self._batch_request(steps, p, tm)
        resp = await self._call(self._unary("ExtendBatch", p), "ExtendBatch", req, timeout)
        tm.lap("rpc_us")
        return self._batch_results(steps, resp, p, "ExtendBatch", tm)

    async def extend_packed(self, layer, steps, q, k, v, *, append_only=False, region=None,
                            timeout=None, fast=None, timings=None):
        """Packed ExtendBatch → PackedResult (see AttentionClient.extend_packed; region: a
        SharedRegion leased by a blocking AttentionClient of the same identity)."""
        tm = Phases(timings)
        method, call = "ExtendBatch", None
        try:
            call, req = self._packed_request(layer, steps, q, k, v, append_only, region, fast,
                                             0, tm)
            stub = self._raw_call(method) if isinstance(req, bytes) else self._seq.ExtendBatch
            resp = await self._call(stub, method, req, timeout)
            tm.lap("rpc_us")
            return self._packed_finish(call, *self._packed_reply(resp, method), method, tm)
        finally:
            if call is not None and region is not None:
                region._busy = False

    def batch_stream(self, *, timeout=None, max_in_flight=2):
        """Opens an ExtendBatchStream → AsyncBatchStream (``async with``; see
        attention_client.aio_batch_stream)."""
        from .aio_batch_stream import AsyncBatchStream
        return AsyncBatchStream(self, timeout=self.timeout if timeout is None else timeout,
                                max_in_flight=max_in_flight)

    def shared_region(self, nbytes, *, timeout=30.0):
        """Not offered on the asyncio client: lease the region with a blocking
        AttentionClient of the same identity and name it in extend_packed(region=)."""
        raise NotImplementedError("shared_region: lease it with a blocking AttentionClient")

    def extend_stream(self, *, timeout=None, max_in_flight=3):
        """Opens an ExtendStream → AsyncExtendStream (``async with``)."""
        return AsyncExtendStream(self, timeout=self.timeout if timeout is None else timeout,
                                 max_in_flight=max_in_flight)


class AsyncSequence(Sequence):
    """Sequence handle of an AsyncAttentionClient: extend, refresh, truncate, fork, release are
    coroutines (arguments and results as Sequence's). ``async with`` releases it."""

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        try:
            await self.release()
        except NotFound:
            pass

    async def extend(self, layer, position, q, k, v, *, timeout=None, fast=None):
        """One Extend step → ExtendResult (see Sequence.extend)."""
        c = self._client
        step = (self, layer, position, q, k, v)
        p = c._plan([step], fast)
        resp = await c._call(c._unary("Extend", p), "Extend", c._step_request(step, p), timeout)
        return c._extend_response(step, resp, p)

    async def refresh(self, *, timeout=None):
        c = self._client
        return self._update((await c._call(c._seq.GetSequence, "GetSequence",
                                           spb.GetSequenceRequest(sequence_id=self.id),
                                           timeout)).sequence)

    async def truncate(self, length, *, timeout=None):
        c = self._client
        return self._update((await c._call(
            c._seq.TruncateSequence, "TruncateSequence",
            spb.TruncateSequenceRequest(sequence_id=self.id, length=int(length)),
            timeout)).sequence)

    async def fork(self, length=None, *, timeout=None):
        c = self._client
        req = spb.ForkSequenceRequest(sequence_id=self.id)
        if length is not None:
            req.length = int(length)
        resp = await c._call(c._seq.ForkSequence, "ForkSequence", req, timeout)
        return AsyncSequence(c, resp.sequence)

    async def release(self, *, timeout=None):
        c = self._client
        return int((await c._call(c._seq.ReleaseSequence, "ReleaseSequence",
                                  spb.ReleaseSequenceRequest(sequence_id=self.id),
                                  timeout)).pages_freed)


class AsyncExtendStream:
    """ExtendStream over grpc.aio with several steps in flight (see stream.ExtendStream):
    ``await submit(...)`` sends one step and returns an asyncio.Future of ExtendResult (a failed
    step's future raises its AttentionError); ``await extend(...)`` waits for the result too.
    At most max_in_flight steps may be unanswered: one more submit raises InvalidArgument
    (await an earlier future first).
    ``async with`` closes it (half-close, then waits for the replies still due)."""

    def __init__(self, client, *, timeout, max_in_flight=3):
        if int(max_in_flight) < 1:
            raise InvalidArgument(f"max_in_flight must be >= 1, got {max_in_flight}")
        self._client = client
        self._max = int(max_in_flight)
        self._pending = collections.deque()
        self._error = None
        self._closed = False
        self._raw = bool(client.wire)  # wire path: bytes both ways (requests of any path)
        opener = (client._raw_call("ExtendStream", "stream_stream") if self._raw
                  else client._seq.ExtendStream)
        self._call = opener(timeout=timeout, metadata=client._metadata())
        self._reader = asyncio.ensure_future(self._read())

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def _read(self):
        err = None
        try:
            while True:
                r = await self._call.read()
                if r is grpc.aio.EOF:
                    break
                fut, step, p = self._pending.popleft()
                try:
                    fut.set_result(self._finish(step, p, r))
                except Exception as e:
                    fut.set_exception(e)
        except grpc.RpcError as e:
            err = from_rpc_error(e, "ExtendStream")
        self._error = self._error or err or Unavailable("ExtendStream ended", None)
        while self._pending:
            self._pending.popleft()[0].set_exception(self._error)

    def _finish(self, step, p, r):
        return self._client._stream_result(step, p, r)

    async def submit(self, sequence, layer, position, q, k, v, *, fast=None):
        """Sends one step (waits for the write) → asyncio.Future of ExtendResult."""
        if self._error is not None or self._closed:
            raise self._error or InvalidArgument("ExtendStream is closed", None)
        if len(self._pending) >= self._max:
            raise InvalidArgument(f"{self._max} steps already in flight (max_in_flight): await "
                                  "one of their futures first", None)
        c = self._client
        position = c._position(sequence, layer, position)
        step = (sequence, layer, position, q, k, v)
        p = c._plan([step], fast)
        req = c._step_request(step, p, raw=self._raw)
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((fut, step, p))
        sequence._lengths[int(layer)] = position + int(q.shape[0])
        try:
            await self._call.write(req)
        except grpc.RpcError as e:
            raise from_rpc_error(e, "ExtendStream") from None
        return fut

    async def extend(self, sequence, layer, position, q, k, v, *, fast=None):
        """await (await submit(...))."""
        return await (await self.submit(sequence, layer, position, q, k, v, fast=fast))

    async def close(self):
        """Half-closes the stream and waits for the replies still due."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._call.done_writing()
        except grpc.RpcError:
            pass
        await self._reader
