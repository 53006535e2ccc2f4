"""ExtendBatchStream over grpc.aio (AsyncAttentionClient.batch_stream): packed batches in flight,
replies matched by tag, as attention_client.batch_stream.BatchStream.

    async with client.batch_stream(max_in_flight=2) as bs:
        fa = await bs.submit(layer, steps_a, qa, ka, va)   # sent; an asyncio.Future
        fb = await bs.submit(layer, steps_b, qb, kb, vb)
        ra, rb = await fa, await fb
"""
import asyncio

import grpc

from .errors import Internal, InvalidArgument, Unavailable, from_rpc_error
from .extend_calls import Phases

_MAX_TAG = (1 << 64) - 1


class AsyncBatchStream:
    """One open ExtendBatchStream on an AsyncAttentionClient (``async with``, or await
    close()). ``await submit(...)`` (arguments as BatchStream.submit, no callback) sends one
    packed batch and returns an asyncio.Future of PackedResult; a request-level error is
    raised by that future only. At most max_in_flight batches may be unanswered: one more
    submit raises InvalidArgument (await an earlier future first). Replies are matched by tag."""

    def __init__(self, client, *, timeout, max_in_flight=2):
        if int(max_in_flight) < 1:
            raise InvalidArgument(f"max_in_flight must be >= 1, got {max_in_flight}")
        self._client = client
        self.max_in_flight = int(max_in_flight)
        self._pending = {}  # tag → (future, _Call, Phases)
        self._next_tag = 1
        self._error = None
        self._closed = False
        self._raw = bool(client.wire)
        opener = (client._raw_call("ExtendBatchStream", "stream_stream") if self._raw
                  else client._seq.ExtendBatchStream)
        self._call = opener(timeout=timeout, metadata=client._metadata())
        self._reader = asyncio.ensure_future(self._read())

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def _read(self):
        method, err = "ExtendBatchStream", None
        try:
            while True:
                r = await self._call.read()
                if r is grpc.aio.EOF:
                    break
                msg, data = self._client._packed_reply(r, method)
                entry = self._pending.pop(int(msg.tag), None)
                if entry is None:
                    raise Internal(f"{method}: reply with tag {msg.tag}, which no batch in "
                                   "flight has", method=method)
                fut, call, tm = entry
                if call.region is not None:
                    call.region._busy = False
                tm.lap("rpc_us")
                try:
                    fut.set_result(self._client._packed_finish(call, msg, data, method, tm,
                                                               stream=True))
                except Exception as e:  # a request-level error or a bad reply
                    fut.set_exception(e)
        except grpc.RpcError as e:
            err = from_rpc_error(e, method)
        except Internal as e:
            err = e
            self._call.cancel()
        self._error = self._error or err or Unavailable(f"{method} ended", None)
        for fut, call, _ in self._pending.values():
            if call.region is not None:
                call.region._busy = False
            fut.set_exception(self._error)
        self._pending = {}

    async def submit(self, layer, steps, q, k, v, *, append_only=False, region=None, tag=None,
                     fast=None, timings=None):
        """Sends one packed batch (waits for the write) → asyncio.Future of PackedResult."""
        if self._error is not None or self._closed:
            raise self._error or InvalidArgument("ExtendBatchStream is closed", None)
        if len(self._pending) >= self.max_in_flight:
            raise InvalidArgument(f"{self.max_in_flight} batches already in flight "
                                  "(max_in_flight): await one of their futures first", None)
        c = self._client
        steps = [(s, c._position(s, layer, pos), n) for s, pos, n in steps]
        if tag is None:
            while self._next_tag in self._pending:
                self._next_tag += 1
            tag, self._next_tag = self._next_tag, self._next_tag + 1
        if not 0 <= int(tag) <= _MAX_TAG or int(tag) in self._pending:
            raise InvalidArgument(f"tag {tag}: not a uint64 or still in flight on this stream")
        tm = Phases(timings)
        call, req = c._packed_request(layer, steps, q, k, v, append_only, region, fast,
                                      int(tag), tm, raw=self._raw)
        fut = asyncio.get_running_loop().create_future()
        self._pending[int(tag)] = (fut, call, tm)
        for seq, pos, n in steps:
            if 0 <= int(layer) < len(seq._lengths):
                seq._lengths[int(layer)] = pos + int(n)
        try:
            await self._call.write(req)
        except grpc.RpcError as e:
            raise from_rpc_error(e, "ExtendBatchStream") from None
        return fut

    async def extend(self, layer, steps, q, k, v, **kw):
        """await (await submit(...))."""
        return await (await self.submit(layer, steps, q, k, v, **kw))

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
