"""Wire encoder/decoder of the fast path's Extend / ExtendBatch / ExtendStream messages.

The protobuf path copies every tensor's bytes into a message, serialises the message (another
copy) and, for the reply, makes a Python bytes object per ``o.data`` (and then copies that
into the output buffer). This module builds and walks the protobuf wire format itself for the
few fields that carry tensor bytes and leaves everything else to protobuf:

Request (encode_request / encode_batch), for each step (an ExtendRequest)::

    ExtendRequest(sequence_id, layer, position).SerializeToString()      # protobuf
    for q, k, v:  tag(field, LEN) varint(len(T)) T, where T is
        Tensor(dtype, shape).SerializeToString()  tag(data, LEN) varint(n)  <n raw bytes>
        (everything before the raw bytes cached per (field, dtype, shape, n))

and ExtendBatchRequest wraps each step as ``tag(steps, LEN) varint(len(step)) step``. Lengths
are computed first; all parts (small bytes objects and memoryviews of the caller's arrays or
of the pinned host buffer) are joined once, so the tensor bytes are copied exactly once here.
The fields come out in field-number order, so the bytes equal protobuf's own serialisation.

Packed request (encode_packed): ``tag(packed, LEN) varint(len) P`` then the request's tag, P
being PackedExtendBatch(layer, steps).SerializeToString(), the q/k/v fields as above (a tensor
in shared memory: dtype and shape only), then PackedExtendBatch(append_only, regions)
serialised: field-number order again. decode_packed walks ExtendBatchResponse → o → data.

Reply (decode_batch / decode_result / decode_response): the bytes are walked (varint tags,
every wire type skipped by its rules, groups included) down results → response → o → data,
and re-serialised without the data fields (nested lengths recomputed, every other field kept
as it is, in wire order); protobuf parses that once, so code, message, length, replayed,
report, dtype and shape (repeated occurrences merged, unknown fields kept) are exactly what
protobuf gives for the original. Of ``o.data`` only its span in the reply is kept (the last
occurrence wins, as in protobuf); :func:`attention_client.fastpath.scatter` copies it straight
into the output buffer. Only length-delimited occurrences of the walked fields are taken
apart; any other wire type for them is left to protobuf.

Field numbers come from the generated descriptors (attention_pb2 / sequence_pb2); importing
this module fails if those fields change kind. Malformed bytes (truncated varints or fields,
wire types 6/7, unmatched groups, field number 0 (as upb: allowed inside unknown groups),
groups nested deeper than 64, bad UTF-8 or anything else protobuf refuses) raise
:class:`attention_client.errors.Internal` (code INTERNAL).
"""
import functools

import grpc
from google.protobuf import descriptor as _d
from google.protobuf.message import DecodeError

from ._pb import attention_pb2 as pb
from ._pb import sequence_pb2 as spb
from .errors import Internal

_VARINT, _I64, _LEN, _SGROUP, _EGROUP, _I32 = 0, 1, 2, 3, 4, 5
_MAX_GROUP_DEPTH = 64


def _field(msg, name, kind):
    f = msg.DESCRIPTOR.fields_by_name[name]
    if f.type != kind:
        raise ImportError(f"attention_client.wire: {msg.DESCRIPTOR.full_name}.{name} is no "
                          f"longer of type {kind}; update wire.py")
    return f.number


_STEPS = _field(spb.ExtendBatchRequest, "steps", _d.FieldDescriptor.TYPE_MESSAGE)
_QKV = tuple(_field(spb.ExtendRequest, n, _d.FieldDescriptor.TYPE_MESSAGE) for n in "qkv")
_DATA = _field(pb.Tensor, "data", _d.FieldDescriptor.TYPE_BYTES)
_RESULTS = _field(spb.ExtendBatchResponse, "results", _d.FieldDescriptor.TYPE_MESSAGE)
_RESPONSE = _field(spb.ExtendResult, "response", _d.FieldDescriptor.TYPE_MESSAGE)
_O = _field(spb.ExtendResponse, "o", _d.FieldDescriptor.TYPE_MESSAGE)
_PACKED = _field(spb.ExtendBatchRequest, "packed", _d.FieldDescriptor.TYPE_MESSAGE)
_PACKED_QKV = tuple(_field(spb.PackedExtendBatch, n, _d.FieldDescriptor.TYPE_MESSAGE)
                    for n in "qkv")
_BATCH_O = _field(spb.ExtendBatchResponse, "o", _d.FieldDescriptor.TYPE_MESSAGE)


def _service_path(method):
    svc = spb.DESCRIPTOR.services_by_name["SequenceService"]
    return f"/{svc.full_name}/{svc.methods_by_name[method].name}"


PATHS = {m: _service_path(m) for m in ("Extend", "ExtendBatch", "ExtendStream",
                                       "ExtendBatchStream", "SharedMemoryLease")}


def varint(n):
    """Non-negative int → its base-128 varint bytes."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _key(field, wire_type):
    return varint((field << 3) | wire_type)


_DATA_KEY = _key(_DATA, _LEN)
_QKV_KEYS = tuple(_key(f, _LEN) for f in _QKV)
_STEPS_KEY = _key(_STEPS, _LEN)
_PACKED_KEY = _key(_PACKED, _LEN)
_PACKED_QKV_KEYS = tuple(_key(f, _LEN) for f in _PACKED_QKV)
_PK_LAYER_KEY = _key(_field(spb.PackedExtendBatch, "layer", _d.FieldDescriptor.TYPE_INT32),
                     _VARINT)
_PK_STEPS_KEY = _key(_field(spb.PackedExtendBatch, "steps", _d.FieldDescriptor.TYPE_MESSAGE),
                     _LEN)
_PS_POS_KEY = _key(_field(spb.PackedStep, "position", _d.FieldDescriptor.TYPE_INT64), _VARINT)
_PS_N_KEY = _key(_field(spb.PackedStep, "query_tokens", _d.FieldDescriptor.TYPE_INT64),
                 _VARINT)
_APPEND_ONLY = spb.PackedExtendBatch(append_only=True).SerializeToString()
_TAG_KEY = _key(_field(spb.ExtendBatchRequest, "tag", _d.FieldDescriptor.TYPE_UINT64), _VARINT)


@functools.lru_cache(maxsize=1024)
def _tensor_prefix(key, wire, shape, n):
    """Everything of a q/k/v field before its n data bytes: key, length, and the Tensor's
    dtype and shape (serialised by protobuf), data key and length. Cached: the shapes of one
    model's calls repeat."""
    th = pb.Tensor(dtype=wire, shape=[int(d) for d in shape]).SerializeToString() + \
        _DATA_KEY + varint(n)
    return key + varint(len(th) + n) + th


def _step_parts(seq_id, layer, position, wire, shapes, views):
    """(parts, nbytes) of one serialised ExtendRequest; views: 3 buffers (q, k, v bytes)."""
    head = spb.ExtendRequest(sequence_id=seq_id, layer=int(layer),
                             position=int(position)).SerializeToString()
    parts, total = [head], len(head)
    for key, shape, view in zip(_QKV_KEYS, shapes, views):
        n = len(view)
        pre = _tensor_prefix(key, int(wire), tuple(int(d) for d in shape), n)
        parts += (pre, view)
        total += len(pre) + n
    return parts, total


def encode_request(seq_id, layer, position, wire, shapes, views):
    """One serialised attention.v1.ExtendRequest (bytes).

    seq_id: str; layer, position: ints; wire: pb.DType of q/k/v; shapes: the 3 shapes of q, k,
    v; views: their raw row-major bytes (bytes-like objects: memoryviews, bytes, numpy uint8
    arrays), each len() bytes long. The tensor bytes are copied once (into the result)."""
    return b"".join(_step_parts(seq_id, layer, position, wire, shapes, views)[0])


def encode_batch(steps):
    """One serialised attention.v1.ExtendBatchRequest (bytes).

    steps: list of (seq_id, layer, position, wire, shapes, views) as encode_request's
    arguments, in order. One copy of the tensor bytes (the final join)."""
    parts = []
    for s in steps:
        sp, n = _step_parts(*s)
        parts.append(_STEPS_KEY + varint(n))
        parts += sp
    return b"".join(parts)


def _varint64(n):
    """An int64/int32 field value → its varint bytes (negative: 10 bytes, two's complement,
    as protobuf writes them). Values under 2^21 (positions, token counts) take a short path."""
    if 0 <= n < 0x80:
        return _SMALL[n]
    if 0 < n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    if 0 < n < 0x200000:
        return bytes(((n & 0x7F) | 0x80, ((n >> 7) & 0x7F) | 0x80, n >> 14))
    return varint(n & 0xFFFFFFFFFFFFFFFF)


_SMALL = tuple(bytes((i,)) for i in range(0x80))
_I32_LIM, _I64_LIM = 1 << 31, 1 << 63
_STEP_IDS = {}


def _step_id(sid):
    """The sequence_id field of a PackedStep, serialised by protobuf (its type checks and
    UTF-8 encoding); kept per id (the cache is emptied past 4096 ids)."""
    b = _STEP_IDS.get(sid)
    if b is None:
        b = spb.PackedStep(sequence_id=sid).SerializeToString()
        if len(_STEP_IDS) >= 4096:
            _STEP_IDS.clear()
        _STEP_IDS[sid] = b
    return b


def _packed_head(layer, steps):
    """PackedExtendBatch(layer, steps).SerializeToString(), written by hand: layer (int32) and
    per step ``tag(steps, LEN) varint(len) id position query_tokens``, zero values left out as
    protobuf does. A value out of its field's range goes to protobuf (which raises)."""
    if not -_I32_LIM <= layer < _I32_LIM:
        return _packed_head_pb(layer, steps)
    parts = [_PK_LAYER_KEY, _varint64(layer)] if layer else []
    for sid, pos, n in steps:
        if not (-_I64_LIM <= pos < _I64_LIM and -_I64_LIM <= n < _I64_LIM):
            return _packed_head_pb(layer, steps)
        body = _step_id(sid) + (_PS_POS_KEY + _varint64(pos) if pos else b"") + \
            (_N_FIELDS[n] if 0 <= n < 0x80 else _PS_N_KEY + _varint64(n))
        parts += (_PK_STEPS_KEY, _SMALL[len(body)] if len(body) < 0x80 else varint(len(body)),
                  body)
    return b"".join(parts)


_N_FIELDS = (b"",) + tuple(_PS_N_KEY + _SMALL[i] for i in range(1, 0x80))


def _packed_head_pb(layer, steps):
    return spb.PackedExtendBatch(
        layer=layer, steps=[spb.PackedStep(sequence_id=sid, position=pos, query_tokens=n)
                            for sid, pos, n in steps]).SerializeToString()


def encode_packed(layer, steps, wire, shapes, views, *, append_only=False, tag=0,
                  regions=None):
    """One serialised attention.v1.ExtendBatchRequest with `packed` set (bytes).

    layer: int; steps: list of (seq_id, position, query_tokens) in row order; wire: pb.DType;
    shapes: the shapes of q, k, v ((total_tokens, N, H), (total_tokens, K, H) twice; q None
    when append_only); views: their raw row-major bytes as encode_request's, or None for a
    tensor sent as dtype and shape only (its bytes in shared memory, or q when append_only).
    regions: None or a dict "q"/"k"/"v"/"o" → pb RegionSlice message (or (region_id, offset,
    bytes)). The fields come out in field-number order (layer, steps, q, k, v, append_only,
    regions) and the request's tag after `packed`, so the bytes equal protobuf's own
    serialisation; the tensor bytes are copied once (the final join). The scalar fields and
    the steps are written here (ids serialised by protobuf once each, cached); the tensors'
    dtype and shape come from protobuf too (cached per shape)."""
    head = _packed_head(int(layer), [(sid, int(pos), int(n)) for sid, pos, n in steps])
    parts, total = [_PACKED_KEY, None, head], len(head)
    wire = int(wire)
    for key, shape, view in zip(_PACKED_QKV_KEYS, shapes, views):
        if shape is None:
            continue
        n = 0 if view is None else len(view)
        pre = _tensor_prefix(key, wire, shape, n) if n else _tensor_head(key, wire, shape)
        parts.append(pre)
        total += len(pre) + n
        if n:
            parts.append(view)
    if regions:
        tail = spb.PackedExtendBatch(append_only=bool(append_only),
                                     **_region_fields(regions)).SerializeToString()
    else:
        tail = _APPEND_ONLY if append_only else b""
    if tail:
        parts.append(tail)
        total += len(tail)
    parts[1] = varint(total)
    tag = int(tag)
    if tag:
        parts.append(_TAG_KEY + varint(tag) if 0 < tag < 1 << 64 else
                     spb.ExtendBatchRequest(tag=tag).SerializeToString())
    return b"".join(parts)


@functools.lru_cache(maxsize=256)
def _tensor_head(key, wire, shape):
    """A q/k/v field carrying dtype and shape only (no data field)."""
    th = pb.Tensor(dtype=wire, shape=[int(d) for d in shape]).SerializeToString()
    return key + varint(len(th)) + th


def _region_fields(regions):
    out = {}
    for name, r in (regions or {}).items():
        if r is None:
            continue
        if not isinstance(r, spb.RegionSlice):
            r = spb.RegionSlice(region_id=r[0], offset=int(r[1]), bytes=int(r[2]))
        out[f"{name}_region"] = r
    return out


class _Malformed(Exception):
    pass


def _read_varint(buf, i, end):
    result = shift = 0
    while True:
        if i >= end:
            raise _Malformed(f"truncated varint at byte {i}")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7
        if shift >= 70:
            raise _Malformed(f"varint longer than 10 bytes at byte {i}")


def _skip(buf, i, end, field, wt, depth=0):
    """Index just past the value of a field of wire type wt starting at i."""
    if wt == _VARINT:
        return _read_varint(buf, i, end)[1]
    if wt == _LEN:
        n, i = _read_varint(buf, i, end)
        j = i + n
    elif wt == _I64:
        j = i + 8
    elif wt == _I32:
        j = i + 4
    elif wt == _SGROUP:
        if depth >= _MAX_GROUP_DEPTH:
            raise _Malformed("groups nested too deep")
        while True:
            key, i = _read_varint(buf, i, end)
            f, w = key >> 3, key & 7
            if w == _EGROUP:
                if f != field:
                    raise _Malformed(f"end of group {f} inside group {field}")
                return i
            i = _skip(buf, i, end, f, w, depth + 1)  # (field 0 allowed here, as upb does)
    else:
        raise _Malformed(f"wire type {wt} (field {field}) at byte {i}")
    if j > end:
        raise _Malformed(f"field {field} runs past its message ({j} > {end})")
    return j


def _split(buf, start, end, pick):
    """Walks the message buf[start:end] → its fields in wire order as (picked, a, b): picked
    False: the whole field (key included) is buf[a:b]; True: a length-delimited occurrence
    of field `pick`, whose value is buf[a:b]."""
    out = []
    i = start
    while i < end:
        a = i
        key = buf[i]  # one-byte keys and lengths (the usual case) read inline
        if key < 0x80:
            i += 1
        else:
            key, i = _read_varint(buf, i, end)
        f, wt = key >> 3, key & 7
        if f == 0:
            raise _Malformed(f"field number 0 at byte {a}")
        if wt == _EGROUP:
            raise _Malformed(f"end of group {f} outside a group at byte {a}")
        if f == pick and wt == _LEN:
            n = buf[i] if i < end else 0x80
            if n < 0x80:
                i += 1
            else:
                n, i = _read_varint(buf, i, end)
            if i + n > end:
                raise _Malformed(f"field {f} runs past its message ({i + n} > {end})")
            out.append((True, i, i + n))
            i += n
        else:
            i = _skip(buf, i, end, f, wt)
            out.append((False, a, i))
    return out


_KEYS = {f: _key(f, _LEN) for f in (_RESULTS, _RESPONSE, _O, _DATA, _BATCH_O)}
_RESULT_PATH = (_RESPONSE, _O, _DATA)


def _strip(buf, mv, start, end, path, datas):
    """The message buf[start:end] re-serialised (list of parts) with the last field of
    `path` (field numbers, outermost first) left out of every nested message along the path;
    the spans of its values are appended to `datas`. Fields keep their wire order, so
    protobuf parses the parts as it would the original, less those fields."""
    parts = []
    for picked, a, b in _split(buf, start, end, path[0]):
        if not picked:
            parts.append(mv[a:b])
        elif len(path) == 1:
            datas.append((a, b))
        else:
            sub = b"".join(_strip(buf, mv, a, b, path[1:], datas))
            parts += (_KEYS[path[0]], varint(len(sub)), sub)
    return parts


# Replies with fewer bytes than this per result are parsed whole by protobuf (parse_whole):
# walking costs ~10 µs a result in Python, more than protobuf's extra copies of small data.
WALK_MIN_BYTES = 64 << 10


def parse_whole(cls, buf, method):
    """cls.FromString(buf) (every field, o.data included), DecodeError → Internal."""
    return _guard(method, cls.FromString, buf)


def _guard(method, fn, *args):
    try:
        return fn(*args)
    except (_Malformed, DecodeError) as e:
        raise Internal(f"{method}: malformed response from the server: {e}",
                       grpc.StatusCode.INTERNAL, method) from None


def _decode_batch(buf):
    mv = memoryview(buf)
    parts, spans = [], []
    for picked, a, b in _split(buf, 0, len(buf), _RESULTS):
        if not picked:
            parts.append(mv[a:b])
            continue
        datas = []
        sub = b"".join(_strip(buf, mv, a, b, _RESULT_PATH, datas))
        parts += (_KEYS[_RESULTS], varint(len(sub)), sub)
        spans.append(datas[-1] if datas else None)
    msg = spb.ExtendBatchResponse.FromString(b"".join(parts))
    return list(zip(msg.results, spans))


def _decode_one(buf, cls, path):
    datas = []
    msg = cls.FromString(b"".join(_strip(buf, memoryview(buf), 0, len(buf), path, datas)))
    return msg, (datas[-1] if datas else None)


def decode_batch(buf, method="ExtendBatch"):
    """Serialised ExtendBatchResponse (bytes) → list, one per result in order, of
    (ExtendResult message whose response.o.data is empty, (start, end) of that o.data in buf
    or None when the reply has no data for it). One protobuf parse of the reply re-serialised
    without the data fields. Raises Internal for malformed bytes."""
    return _guard(method, _decode_batch, buf)


def decode_result(buf, method="ExtendStream"):
    """Serialised ExtendResult (one ExtendStream reply) → (ExtendResult without o.data,
    data span or None) as decode_batch's entries. Raises Internal for malformed bytes."""
    return _guard(method, _decode_one, buf, spb.ExtendResult, _RESULT_PATH)


def decode_response(buf, method="Extend"):
    """Serialised ExtendResponse (an Extend reply) → (ExtendResponse without o.data, data
    span or None). Raises Internal for malformed bytes."""
    return _guard(method, _decode_one, buf, spb.ExtendResponse, _RESULT_PATH[1:])


def decode_packed(buf, method="ExtendBatch"):
    """Serialised ExtendBatchResponse of a packed batch (an ExtendBatch or ExtendBatchStream
    reply) → (ExtendBatchResponse without o.data, (start, end) of o.data in buf or None).
    Raises Internal for malformed bytes."""
    return _guard(method, _decode_one, buf, spb.ExtendBatchResponse, (_BATCH_O, _DATA))
