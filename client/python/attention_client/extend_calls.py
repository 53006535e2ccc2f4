"""Building the requests and reading the replies of Extend / ExtendBatch / ExtendStream (a mixin
of AttentionClient; AsyncAttentionClient, Sequence, the stream helpers share it).

Three paths, chosen per call:
  old (fast=False, or tensors the fast path cannot take): arrays converted through numpy into
      protobuf messages (tensors.encode / decode);
  fast + protobuf (client.wire = False): the fast path's raw bytes (fastpath.tensor_views)
      copied into protobuf messages, sent through the generated stubs;
  fast + wire (client.wire = True, the default): the request bytes built by
      attention_client.wire (one copy of the tensor bytes) and the reply walked by it (o.data
      copied once, straight into the output buffer), sent through per-method callables of
      the same channel whose serializers are the identity (same metadata, deadline and
      error mapping as the stubs); replies under wire.WALK_MIN_BYTES per result are parsed
      whole by protobuf instead (cheaper for decode steps; same results).
All three give the same values. Timers: :class:`Phases` adds the wall time of each phase of a
call (microseconds) into a caller's dict: gather_us (tensor views; for CUDA the one
device→host copy), encode_us (building the request), rpc_us (the gRPC call; on the protobuf
paths it includes protobuf's serialisation and parsing, done inside grpcio), decode_us
(walking/reading the reply, building the results), scatter_us (copying o into the output
buffer; for CUDA the one host→device copy).
"""
import time

from . import fastpath as _fp
from . import tensors as _t
from . import wire as _wire
from ._pb import sequence_pb2 as spb
from .errors import Internal, InvalidArgument, from_code

PHASES = ("gather_us", "encode_us", "rpc_us", "decode_us", "scatter_us")


class Phases:
    """Phases(out): lap(name) adds the µs since the last lap (or creation) to out[name];
    out None: nothing is recorded."""
    __slots__ = ("out", "t")

    def __init__(self, out=None):
        self.out, self.t = out, time.perf_counter()

    def lap(self, name):
        now = time.perf_counter()
        if self.out is not None:
            self.out[name] = self.out.get(name, 0.0) + (now - self.t) * 1e6
        self.t = now


class ExtendCalls:
    """Mixin: needs self._channel, self._seq (SequenceService stub), self._extend_result.
    Attribute wire: True (default) sends the fast path through attention_client.wire, False
    through protobuf messages (kept to compare and as a fallback switch)."""
    wire = True

    def _raw_call(self, method, kind="unary_unary"):
        """The channel's callable for SequenceService.<method> that sends and returns bytes as
        they are (no serializers), made once per client."""
        cache = self.__dict__.setdefault("_raw_calls", {})
        call = cache.get(method)
        if call is None:
            call = cache[method] = getattr(self._channel, kind)(_wire.PATHS[method])
        return call

    @staticmethod
    def _position(seq, layer, position):
        if position is None:
            lens = seq._lengths
            if not 0 <= int(layer) < len(lens):
                raise InvalidArgument(f"layer: expected [0, {len(lens)}), got {layer}",
                                      method="Extend")
            position = lens[layer]
        return int(position)

    def _extend_request(self, seq, layer, position, q, k, v):
        """The old path: arrays converted through numpy (torch bf16 widened to float32)."""
        qa, qwire = _t.to_numpy(q)
        ka, _ = _t.to_numpy(k)
        va, _ = _t.to_numpy(v)
        wire = seq.info.dtype
        position = self._position(seq, layer, position)
        return spb.ExtendRequest(sequence_id=seq.id, layer=int(layer), position=position,
                                 q=_t.encode(qa, wire), k=_t.encode(ka, wire),
                                 v=_t.encode(va, wire))

    @staticmethod
    def _plan(steps, fast):
        """fastpath.Plan for these steps, or None for the old path. fast: None (fast when
        possible), True (fast or InvalidArgument saying why not), False (old path)."""
        if fast is False:
            return None
        p, why = _fp.plan(steps)
        if p is None and fast:
            raise InvalidArgument(f"fast=True but the fast path cannot take these tensors: {why}")
        return p

    def _fast_fill(self, msg, p, step, data):
        seq, layer, position, q, k, v = step
        msg.sequence_id = seq.id
        msg.layer = int(layer)
        msg.position = self._position(seq, layer, position)
        for m, t, d in zip((msg.q, msg.k, msg.v), (q, k, v), data):
            _fp.fill_tensor(m, p.wire, t.shape, d)

    def _wire_step(self, p, step, views):
        seq, layer, position, q, k, v = step
        return (seq.id, int(layer), self._position(seq, layer, position), p.wire,
                (q.shape, k.shape, v.shape), views)

    def _unary(self, method, p):
        """The callable of a unary method for Plan p: raw bytes on the wire path, else the
        stub's."""
        return self._raw_call(method) if p is not None and self.wire else getattr(self._seq,
                                                                                   method)

    def _batch_request(self, steps, p, tm=None):
        """The ExtendBatch request for `steps` by Plan `p`: an ExtendBatchRequest message (old
        path: p None, or self.wire False) or its serialised bytes (wire path)."""
        tm = tm or Phases()
        if p is None:
            req = spb.ExtendBatchRequest(steps=[self._extend_request(*s) for s in steps])
            tm.lap("encode_us")
            return req
        views = _fp.tensor_views(p, [t for s in steps for t in s[3:6]])
        tm.lap("gather_us")
        if self.wire:
            req = _wire.encode_batch([self._wire_step(p, s, views[3 * i:3 * i + 3])
                                      for i, s in enumerate(steps)])
        else:
            req = spb.ExtendBatchRequest()
            for i, s in enumerate(steps):
                self._fast_fill(req.steps.add(), p, s,
                                [x.tobytes() for x in views[3 * i:3 * i + 3]])
        tm.lap("encode_us")
        return req

    @classmethod
    def _batch_results(cls, steps, resp, p, method="ExtendBatch", tm=None):
        """The reply → list of ExtendResult or AttentionError, updating the handles' lengths.
        resp: ExtendBatchResponse, a list of ExtendResult messages, or the reply's bytes
        (wire path). Raises Internal for a malformed reply or a wrong number of results."""
        tm = tm or Phases()
        if isinstance(resp, bytes) and len(resp) < _wire.WALK_MIN_BYTES * max(1, len(steps)):
            resp = _wire.parse_whole(spb.ExtendBatchResponse, resp, method)
        if isinstance(resp, bytes):
            mv = memoryview(resp)
            entries = [(r, b"" if sp is None else mv[sp[0]:sp[1]])
                       for r, sp in _wire.decode_batch(resp, method)]
        else:
            results = list(resp.results) if hasattr(resp, "results") else list(resp)
            entries = [(r, None) for r in results]
        if len(entries) != len(steps):
            raise Internal(f"{method}: {len(entries)} results for {len(steps)} steps")
        tm.lap("decode_us")
        os_ = None
        if p is not None:
            os_ = _fp.scatter(p, [None if r.code != 0 else
                                  (tuple(s[3].shape), r.response.o.dtype,
                                   r.response.o.data if d is None else d)
                                  for s, (r, d) in zip(steps, entries)])
        tm.lap("scatter_us")
        out = []
        for i, (s, (r, d)) in enumerate(zip(steps, entries)):
            if r.code != 0:
                out.append(from_code(r.code, r.message, method))
                continue
            if os_ is None and d is not None:
                r.response.o.data = bytes(d)
            res = cls._extend_result(r.response, s[3], None if os_ is None else os_[i])
            s[0]._lengths[s[1]] = res.length
            out.append(res)
        tm.lap("decode_us")
        return out

    def _step_request(self, step, p, raw=None):
        """One step's ExtendRequest: a message, or its serialised bytes on the wire path.
        raw: None (wire path per self.wire), True (always bytes: a stream opened with raw
        callables), False (always a message: a stream opened with the stub)."""
        if p is None:
            req = self._extend_request(*step)
        else:
            views = _fp.tensor_views(p, step[3:6])
            if self.wire if raw is None else raw:
                return _wire.encode_request(*self._wire_step(p, step, views))
            req = spb.ExtendRequest()
            self._fast_fill(req, p, step, [x.tobytes() for x in views])
        return req.SerializeToString() if raw else req

    def _response_result(self, step, msg, p, data=None):
        """ExtendResponse message → ExtendResult. data: the o bytes when msg.o.data was left out
        (wire path), else None."""
        q = step[3]
        if p is None:
            if data is not None:
                msg.o.data = bytes(data)
            return self._extend_result(msg, q)
        o = _fp.scatter(p, [(tuple(q.shape), msg.o.dtype,
                             msg.o.data if data is None else data)])[0]
        return self._extend_result(msg, q, o)

    def _extend_response(self, step, resp, p):
        """An Extend reply (ExtendResponse message or bytes) → ExtendResult; updates the
        handle's length. Raises Internal for a malformed reply."""
        data = None
        if isinstance(resp, bytes) and len(resp) < _wire.WALK_MIN_BYTES:
            resp = _wire.parse_whole(spb.ExtendResponse, resp, "Extend")
        if isinstance(resp, bytes):
            buf = resp
            resp, sp = _wire.decode_response(buf, "Extend")
            data = b"" if sp is None else memoryview(buf)[sp[0]:sp[1]]
        res = self._response_result(step, resp, p, data)
        step[0]._lengths[step[1]] = res.length
        return res

    def _stream_result(self, step, p, r, method="ExtendStream"):
        """One ExtendStream reply (ExtendResult message or bytes) → ExtendResult; raises the
        step's AttentionError, or Internal for a malformed reply."""
        data = None
        if isinstance(r, bytes) and len(r) < _wire.WALK_MIN_BYTES:
            r = _wire.parse_whole(spb.ExtendResult, r, method)
        if isinstance(r, bytes):
            buf = r
            r, sp = _wire.decode_result(buf, method)
            data = b"" if sp is None else memoryview(buf)[sp[0]:sp[1]]
        if r.code != 0:
            raise from_code(r.code, r.message, method)
        res = self._response_result(step, r.response, p, data)
        step[0]._lengths[step[1]] = res.length
        return res
