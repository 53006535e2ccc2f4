"""The packed ExtendBatch (ExtendBatchRequest.packed): one layer's step for many sequences with one
q, k and v tensor for all of them (a mixin of AttentionClient; the async client, BatchStream and
SharedRegion share it).

    r = client.extend_packed(layer, [(seq_a, None, 1), (seq_b, None, 3)], q, k, v)
    r.o          # (4, N, H): rows 0 (seq_a) and 1..3 (seq_b), q's dtype, kind and device
    r.steps      # [StepResult(length, replayed, kv_len) or the step's AttentionError, ...]

Rows: step i owns rows [start_i, start_i + T_i) of q, k, v and o, start_i the sum of the T of
the steps before it. The tensors travel as fastpath does (bytes as they are; torch CUDA: one
device→host copy of q, k and v together into pinned memory, o back with one host→device
copy); the request is built by attention_client.wire.encode_packed (one copy of the tensor
bytes) and o.data of the reply is copied once, straight into the output (replies under
16 x wire.WALK_MIN_BYTES are parsed whole by protobuf). client.wire = False sends the same
request as a protobuf message. Tensors not of the sequences' dtype (e.g. float32 arrays for a
bf16 sequence) are converted first (fast=None), refused (fast=True) or always converted
(fast=False); converted outputs come back as the old path's (bf16: ml_dtypes.bfloat16 arrays
when installed, else float32; torch inputs: torch tensors of q's dtype and device).
"""
import dataclasses

import numpy as np

from . import fastpath as _fp
from . import tensors as _t
from . import wire as _wire
from ._pb import attention_pb2 as pb
from ._pb import sequence_pb2 as spb
from .errors import Internal, InvalidArgument, from_code
from .extend_calls import Phases
from .report import Report


@dataclasses.dataclass
class StepResult:
    """One successful step of a packed batch: length (the layer's length after the step),
    replayed (an exact replay: nothing appended, its stored o returned), kv_len (keys
    attended; 0 for append-only)."""
    length: int
    replayed: bool
    kv_len: int


@dataclasses.dataclass
class PackedResult:
    """Result of a packed ExtendBatch.

    o: (total_tokens, N, H) in q's dtype, kind and device (rows of failed steps are zeros);
       None for append_only. steps: one per step, in order: StepResult, or the AttentionError
       of a step the server refused. report: the batch's Report (times of its slowest step;
       batch_size: the steps). tag: the request's tag (BatchStream)."""
    o: object
    steps: list
    report: object
    tag: int = 0


# Packed replies under 16 x wire.WALK_MIN_BYTES (1 MiB) are parsed whole by protobuf: a packed
# reply has one o whatever its steps, and protobuf's parse with its extra copies of o.data is
# cheaper than the walk up to about that size (bf16 N32 H128, CPU host: B=32 (256 KiB) 22 µs
# whole vs 36 µs walked, B=128 (1 MiB) 159 vs 169 µs). WALK_MIN_BYTES = 0 walks every reply.
_PARSE_WHOLE_FACTOR = 16


class _NoPhases:
    """Phases when the caller asked for no timings: lap() does nothing (not even read the
    clock)."""
    __slots__ = ()

    @staticmethod
    def lap(name):
        pass


_NO_PHASES = _NoPhases()


class _Call:
    """What reading one packed reply needs: handles, layer, Plan, o's shape, the region and
    its layout, and how to convert o back (None: the fast path's output as it is)."""
    __slots__ = ("seqs", "steps", "layer", "p", "o_shape", "region", "layout", "convert",
                 "tag")


def _wire_numpy(x, wire):
    """The converting path: x (numpy, torch, array-like) → contiguous numpy array holding the
    wire dtype's bytes (bf16 as uint16 bits)."""
    a, _ = _t.to_numpy(x)
    if wire == pb.FLOAT32:
        return np.ascontiguousarray(a, dtype="<f4")
    if wire == pb.FLOAT16:
        return np.ascontiguousarray(a, dtype="<f2")
    if a.dtype.name == "bfloat16" or a.dtype == np.uint16:
        return np.ascontiguousarray(a).view("<u2")
    return _t.float32_to_bf16_bits(np.asarray(a, dtype=np.float32))


def _convert_back(o, q):
    """uint16 bf16 bits / fp32 / fp16 numpy o of the converting path → what the old path
    returns for q (torch q: a tensor of q's dtype and device)."""
    if o.dtype == np.uint16:
        o = o.view(_t.BFLOAT16) if _t.BFLOAT16 is not None else _t.bf16_bits_to_float32(o)
    if _t._is_torch(q):
        return _t.to_torch(o, q)
    return o


class PackedCalls:
    """Mixin of AttentionClient: extend_packed and the request/reply code BatchStream shares.
    Needs ExtendCalls (self._position, self._raw_call, self._call, self.wire)."""

    def extend_packed(self, layer, steps, q, k, v, *, append_only=False, region=None,
                      timeout=None, fast=None, timings=None):
        """One packed ExtendBatch: one layer's step for many sequences, one tensor per q/k/v.

        layer: the layer index (every step's). steps: list of (sequence, position, T):
        Sequence handle, position (None: the handle's known length of that layer), T >= 1 the
        step's query tokens; no sequence twice. q (total_tokens, N, H), k and v
        (total_tokens, K, H), total_tokens = sum of the T, row-major, the steps' rows in order:
        numpy arrays or torch tensors (CPU or CUDA, one device). append_only=True: q must be
        None; k/v are appended, nothing is attended, o is None (a prefill computed elsewhere).
        region: a SharedRegion: q/k/v are written into it (unless they already are its
        arrays() views) and o is read from it; only slices are sent (timings include those
        copies: gather_us and scatter_us). Or a CudaRegion (same GPU as the server; q/k/v
        torch CUDA tensors on its device): q/k/v are copied device to device into it on the
        current stream and its event recorded; after the reply the current stream waits on
        the server's event and o is cloned out of the region (a CUDA tensor; nothing crosses
        the host).
        fast, timings: as extend_batch's (phases gather_us, encode_us, rpc_us, decode_us,
        scatter_us).
        Returns PackedResult(o, steps, report): o (total_tokens, N, H) of q's dtype and kind
        (rows of failed steps zero), steps: StepResult or the step's AttentionError (a refused
        step: the same codes as Extend; the handles of successful steps get their new length).
        Raises InvalidArgument (client-side checks: q given with append_only or missing
        without, ranks, row counts not summing to the total, a region too small or busy; the
        server's for malformed tensors, steps on two layers, a sequence twice), NotFound (an
        unknown region), ResourceExhausted (queue full, message too large), and the other
        request-level errors of ExtendBatch.
        """
        tm = Phases(timings) if timings is not None else _NO_PHASES
        method, call = "ExtendBatch", None
        try:
            call, req = self._packed_request(layer, steps, q, k, v, append_only, region, fast,
                                             0, tm)
            stub = self._raw_call(method) if isinstance(req, bytes) else self._seq.ExtendBatch
            resp = self._call(stub, method, req, timeout)
            tm.lap("rpc_us")
            return self._packed_finish(call, *self._packed_reply(resp, method), method, tm)
        finally:
            if call is not None and region is not None:
                region._busy = False

    # -- request ---------------------------------------------------------------------------
    def _packed_plan(self, seqs, tensors, fast):
        """(Plan, convert) for the packed tensors: the fast path's Plan over them, or the Plan
        over their converted numpy copies (convert True; the copies replace `tensors`)."""
        p, why = (None, "fast=False") if fast is False else _fp.plan_tensors(seqs, tensors)
        if p is not None:
            return p, False
        if fast:
            raise InvalidArgument(f"fast=True but the fast path cannot take these tensors: {why}")
        wire = seqs[0].info.dtype
        tensors[:] = [_wire_numpy(t, wire) for t in tensors]
        p, why = _fp.plan_tensors(seqs, tensors)
        if p is None:
            raise InvalidArgument(f"extend_packed: {why}")
        return p, True

    def _packed_check(self, layer, steps, q, k, v, append_only):
        """Client-side checks → (handles, [(seq_id, position, T)], total_tokens)."""
        if append_only and q is not None:
            raise InvalidArgument("append_only=True: q must be None (nothing is attended)")
        if not append_only and q is None:
            raise InvalidArgument("q is None: give q, or append_only=True to only append k/v")
        if not steps:
            raise InvalidArgument("extend_packed: no steps")
        seqs, wire_steps, total = [], [], 0
        position_of = self._position
        for seq, position, n in steps:
            t = int(n)
            if t < 1:
                raise InvalidArgument(f"step of sequence {seq.id}: T must be >= 1, got {n}")
            seqs.append(seq)
            wire_steps.append((seq.id, position_of(seq, layer, position), t))
            total += t
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t is None:
                continue
            if len(t.shape) != 3 or int(t.shape[0]) != total:
                raise InvalidArgument(f"{name} must be (total_tokens={total}, heads, H) (the "
                                      f"steps' T summed); got shape {tuple(t.shape)}")
        return seqs, wire_steps, total

    def _packed_request(self, layer, steps, q, k, v, append_only, region, fast, tag, tm,
                        raw=None):
        """(_Call, request): the request is the serialised ExtendBatchRequest (wire path, or
        raw True) or the protobuf message (client.wire False, raw None/False)."""
        seqs, wire_steps, total = self._packed_check(layer, steps, q, k, v, append_only)
        tensors = [t for t in (q, k, v) if t is not None]
        p, convert = self._packed_plan(seqs, tensors, fast)
        shapes = ([None] if append_only else []) + [tuple(t.shape) for t in tensors]
        c = _Call()
        c.seqs, c.steps, c.layer, c.p, c.region, c.tag = seqs, wire_steps, int(layer), p, \
            region, int(tag)
        c.o_shape = None if append_only else (total,) + tuple(shapes[0][1:])
        c.convert = q if convert else None
        views, regions = [None, None, None], None
        if region is not None:
            c.layout, regions = region._stage(p, shapes, tensors, append_only)
        else:
            c.layout = None
            views = ([None] if append_only else []) + _fp.tensor_views(p, tensors)
        tm.lap("gather_us")
        if (self.wire if raw is None else raw):
            req = _wire.encode_packed(layer, wire_steps, p.wire, shapes, views,
                                      append_only=append_only, tag=tag, regions=regions)
        else:
            req = self._packed_message(layer, wire_steps, p.wire, shapes, views, append_only,
                                       tag, regions)
        tm.lap("encode_us")
        return c, req

    @staticmethod
    def _packed_message(layer, wire_steps, wire, shapes, views, append_only, tag, regions):
        """The same request as a protobuf ExtendBatchRequest (tensor bytes copied in)."""
        req = spb.ExtendBatchRequest(tag=int(tag))
        pk = req.packed
        pk.layer = int(layer)
        for sid, pos, n in wire_steps:
            pk.steps.add(sequence_id=sid, position=pos, query_tokens=n)
        for msg, shape, view in zip((pk.q, pk.k, pk.v), shapes, views):
            if shape is not None:
                _fp.fill_tensor(msg, wire, shape, b"" if view is None else bytes(view))
        pk.append_only = bool(append_only)
        for name, r in _wire._region_fields(regions).items():
            getattr(pk, name).CopyFrom(r)
        return req

    # -- reply -----------------------------------------------------------------------------
    @staticmethod
    def _packed_reply(resp, method):
        """A reply (bytes on the wire path, else an ExtendBatchResponse) → (message, o bytes:
        a memoryview of the reply when its o.data was walked out, else None)."""
        if not isinstance(resp, bytes):
            return resp, None
        if len(resp) < _PARSE_WHOLE_FACTOR * _wire.WALK_MIN_BYTES:
            return _wire.parse_whole(spb.ExtendBatchResponse, resp, method), None
        msg, sp = _wire.decode_packed(resp, method)
        return msg, (b"" if sp is None else memoryview(resp)[sp[0]:sp[1]])

    def _packed_finish(self, c, msg, data, method, tm, stream=False):
        """(_Call, reply message, o bytes or None) → PackedResult. A request-level error in
        the reply (ExtendBatchStream) raises it; a wrong number of results or a wrong o size
        raises Internal. stream: lengths only grow (replies may come out of order)."""
        if msg.code != 0:
            raise from_code(msg.code, msg.message, method)
        if len(msg.steps) != len(c.steps):
            raise Internal(f"{method}: {len(msg.steps)} step results for {len(c.steps)} steps",
                           method=method)
        tm.lap("decode_us")
        o = self._packed_o(c, msg, data) if c.o_shape is not None else None
        tm.lap("scatter_us")
        out, layer = [], c.layer
        for seq, r in zip(c.seqs, msg.steps):
            if r.code != 0:
                out.append(from_code(r.code, r.message, method))
                continue
            length = int(r.length)
            out.append(StepResult(length, bool(r.replayed), int(r.kv_len)))
            lens = seq._lengths
            if 0 <= layer < len(lens):
                lens[layer] = max(lens[layer], length) if stream else length
        tm.lap("decode_us")
        return PackedResult(o=o, steps=out, report=Report.from_pb(msg.report), tag=int(msg.tag))

    @staticmethod
    def _packed_o(c, msg, data):
        p = c.p
        if c.region is not None:
            o = c.region._read_o(p, c.layout, c.o_shape)
        else:
            data = msg.o.data if data is None else data
            if len(data) == 0 and all(r.code != 0 for r in msg.steps):
                n = int(np.prod(c.o_shape)) * _fp._ITEMSIZE[p.wire]
                data = bytes(n)  # every step refused: an all-zero o
            o = _fp.scatter_one(p, c.o_shape, msg.o.dtype or p.wire, data)
        return o if c.convert is None else _convert_back(o, c.convert)
