"""The packed ExtendBatch's client side without a server: attention_client.wire.encode_packed vs
protobuf's own serialisation, decode_packed vs protobuf parsing, extend_packed's request building
(wire and protobuf paths, fast and converting) and reply reading, and layer_calls.plan_chunks.

Encoder: bytes equal to protobuf's serialisation of the same ExtendBatchRequest for fp32 / fp16 /
bf16 (uint16 bits), 1 and 40 steps, multi-byte length varints, layer 0, tags 0 and 2^64-1,
append-only, tensors in shared-memory regions. Decoder: the message protobuf parses, less
o.data, whose span holds exactly o.data, with unknown fields and repeated o occurrences; every
truncation parses as protobuf does or raises Internal.
Run: PYTHONPATH=client/python python3 -m pytest -q tests/python/test_client_packed_wire.py
"""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import attention_client as ac  # noqa: E402
from attention_client import AttentionClient, wire  # noqa: E402
from attention_client._pb import attention_pb2 as pb  # noqa: E402
from attention_client._pb import sequence_pb2 as spb  # noqa: E402
from attention_client.extend_calls import Phases  # noqa: E402
from attention_client.layer_calls import plan_chunks  # noqa: E402
from attention_client.sequence import Sequence  # noqa: E402
from google.protobuf.message import DecodeError  # noqa: E402

DT = {"float32": pb.FLOAT32, "float16": pb.FLOAT16, "bfloat16": pb.BFLOAT16}
NP = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


@pytest.fixture(scope="module")
def offline():
    """A client whose channel never connects (request building needs only its handles)."""
    with AttentionClient("127.0.0.1:9", timeout=1) as c:
        yield c


def handle(client, dtype, i, length=0):
    info = spb.SequenceInfo(sequence_id=f"{i:032x}", num_layers=3, dtype=DT[dtype],
                            layer_lengths=[length] * 3)
    return Sequence(client, info)


def arrays(rng, total, heads, h, dtype):
    a = rng.standard_normal((total, heads, h)).astype(np.float32)
    if dtype == "bfloat16":
        return ac.float32_to_bf16_bits(a)
    return a.astype(NP[dtype])


def proto_request(layer, steps, wire_dt, tensors, append_only=False, tag=0, regions=None):
    """The same request built field by field through protobuf."""
    req = spb.ExtendBatchRequest(tag=tag)
    pk = req.packed
    pk.layer = layer
    for sid, pos, n in steps:
        pk.steps.add(sequence_id=sid, position=pos, query_tokens=n)
    for msg, t, name in zip((pk.q, pk.k, pk.v), tensors, "qkv"):
        if t is None:
            continue
        msg.dtype = wire_dt
        msg.shape.extend(t.shape)
        if not regions or name not in regions:
            msg.data = t.tobytes()
    pk.append_only = append_only
    for name, (rid, off, n) in (regions or {}).items():
        r = getattr(pk, f"{name}_region")
        r.region_id, r.offset, r.bytes = rid, off, n
    return req


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("nsteps,h", [(1, 8), (40, 64)])
@pytest.mark.parametrize("layer,tag", [(0, 0), (2, (1 << 64) - 1)])
def test_encode_packed_equals_protobuf(dtype, nsteps, h, layer, tag):
    rng = np.random.default_rng(nsteps + h)
    steps = [(f"{i:032x}" if i else "", 3 * i, 1 + i % 3) for i in range(nsteps)]
    total = sum(n for _, _, n in steps)
    q, k, v = arrays(rng, total, 4, h, dtype), arrays(rng, total, 2, h, dtype), \
        arrays(rng, total, 2, h, dtype)
    views = [np.ascontiguousarray(t).reshape(-1).view(np.uint8) for t in (q, k, v)]
    got = wire.encode_packed(layer, steps, DT[dtype], (q.shape, k.shape, v.shape), views,
                             tag=tag)
    want = proto_request(layer, steps, DT[dtype], (q, k, v), tag=tag).SerializeToString()
    assert got == want
    if nsteps == 40 and h == 64:
        assert len(views[0]) >= 1 << 14  # the tensors' lengths need multi-byte varints


def test_encode_packed_append_only_and_regions():
    rng = np.random.default_rng(3)
    steps = [("ab" * 16, 0, 5), ("cd" * 16, 7, 2)]
    k, v = arrays(rng, 7, 2, 16, "float32"), arrays(rng, 7, 2, 16, "float32")
    kb = np.ascontiguousarray(k).reshape(-1).view(np.uint8)
    got = wire.encode_packed(1, steps, pb.FLOAT32, (None, k.shape, v.shape),
                             [None, kb, memoryview(v.tobytes())], append_only=True, tag=4)
    assert got == proto_request(1, steps, pb.FLOAT32, (None, k, v), append_only=True,
                                tag=4).SerializeToString()
    q = arrays(rng, 7, 4, 16, "float32")
    regions = {"q": ("r" * 32, 0, q.nbytes), "k": ("r" * 32, 1024, k.nbytes),
               "v": ("r" * 32, 2048, v.nbytes), "o": ("r" * 32, 4096, q.nbytes)}
    got = wire.encode_packed(2, steps, pb.FLOAT32, (q.shape, k.shape, v.shape),
                             [None, None, None], regions=regions)
    want = proto_request(2, steps, pb.FLOAT32, (q, k, v), regions=regions)
    assert got == want.SerializeToString()
    assert not want.packed.q.data and want.packed.o_region.offset == 4096


@pytest.mark.parametrize("value", [1, 127, 128, 0x3FFF, 0x4000, 0x1FFFFF, 0x200000, 1 << 40,
                                   (1 << 63) - 1, -1, -(1 << 63)])
def test_encode_packed_hand_written_fields_equal_protobuf(value):
    """The steps and scalars encode_packed writes itself: every varint length class of
    position and query_tokens (negative int64s: 10 bytes), layer at the int32 edges, long and
    non-ASCII ids (a step longer than 127 bytes), equal to protobuf's bytes."""
    layer = max(-(1 << 31), min(value, (1 << 31) - 1))
    steps = [("ab" * 16, value, 1), ("é" * 70, 5, value), ("", value, value)]
    views = [memoryview(b"\0" * 8)] * 3
    shapes = [(1, 2, 2)] * 3
    got = wire.encode_packed(layer, steps, pb.FLOAT16, shapes, views, tag=3)
    want = proto_request(layer, steps, pb.FLOAT16, [np.zeros(s, np.float16) for s in shapes],
                         tag=3)
    assert got == want.SerializeToString()


@pytest.mark.parametrize("bad", [dict(layer=1 << 31), dict(position=1 << 63),
                                 dict(tokens=-(1 << 63) - 1), dict(tag=-1), dict(tag=1 << 64)])
def test_encode_packed_out_of_range_raises_as_protobuf(bad):
    """Values out of their field's range raise protobuf's ValueError (nothing is sent)."""
    steps = [("ab" * 16, bad.get("position", 0), bad.get("tokens", 1))]
    with pytest.raises(ValueError, match="out of range"):
        wire.encode_packed(bad.get("layer", 0), steps, pb.FLOAT16, [(1, 1, 1)] * 3,
                           [b"ab"] * 3, tag=bad.get("tag", 0))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("append_only", [False, True])
def test_client_request_wire_equals_protobuf_path(offline, dtype, append_only):
    rng = np.random.default_rng(11)
    a, b = handle(offline, dtype, 1, length=3), handle(offline, dtype, 2)
    q = None if append_only else arrays(rng, 4, 4, 8, dtype)
    k, v = arrays(rng, 4, 2, 8, dtype), arrays(rng, 4, 2, 8, dtype)
    steps = [(a, None, 1), (b, 0, 3)]
    ca, raw = offline._packed_request(1, steps, q, k, v, append_only, None, True, 9, Phases(),
                                      raw=True)
    _, msg = offline._packed_request(1, steps, q, k, v, append_only, None, True, 9, Phases(),
                                     raw=False)
    assert raw == msg.SerializeToString()
    assert [(s.position, s.query_tokens) for s in msg.packed.steps] == [(3, 1), (0, 3)]
    assert msg.packed.append_only == append_only and msg.packed.HasField("q") != append_only
    assert ca.o_shape == (None if append_only else (4, 4, 8))


def test_converting_path_sends_the_wire_dtype(offline):
    """float32 arrays for a bf16 sequence: converted (round to nearest even) unless fast=True."""
    rng = np.random.default_rng(5)
    s = handle(offline, "bfloat16", 1)
    q, k = (rng.standard_normal((2, n, 8)).astype(np.float32) for n in (4, 2))
    with pytest.raises(ac.InvalidArgument, match="fast=True"):
        offline._packed_request(0, [(s, 0, 2)], q, k, k, False, None, True, 0, Phases())
    c, msg = offline._packed_request(0, [(s, 0, 2)], q, k, k, False, None, None, 0, Phases(),
                                     raw=False)
    assert msg.packed.q.dtype == pb.BFLOAT16
    assert msg.packed.q.data == ac.float32_to_bf16_bits(q).tobytes()
    assert c.convert is q


@pytest.mark.parametrize("bad,match", [
    (dict(append_only=True), "q must be None"),
    (dict(q=None), "append_only=True"),
    (dict(steps=[]), "no steps"),
    (dict(t=0), "T must be >= 1"),
    (dict(t=2), "total_tokens=4"),
])
def test_client_side_refusals(offline, bad, match):
    a, b = handle(offline, "float32", 1), handle(offline, "float32", 2)
    q = np.zeros((3, 4, 8), np.float32)
    k = np.zeros((3, 2, 8), np.float32)
    steps = bad.get("steps", [(a, 0, 1), (b, 0, bad.get("t", 2) if "t" in bad else 2)])
    if bad.get("t") == 2:
        steps = [(a, 0, 2), (b, 0, 2)]
    with pytest.raises(ac.InvalidArgument, match=match):
        offline._packed_request(0, steps, bad.get("q", q), k, k, bad.get("append_only", False),
                                None, None, 0, Phases())
    assert a.layer_lengths == [0, 0, 0]


def reply(o_bytes, codes, tag=7, extra=b""):
    resp = spb.ExtendBatchResponse(tag=tag)
    resp.o.dtype = pb.FLOAT32
    resp.o.shape.extend([len(o_bytes) // 4, 1, 1])
    resp.o.data = o_bytes
    for i, c in enumerate(codes):
        resp.steps.add(code=c, message="" if c == 0 else f"step {i} refused",
                       length=0 if c else 10 + i, kv_len=0 if c else 10 + i)
    resp.report.backend = "cpu"
    resp.report.times.total_us = 42
    return resp, resp.SerializeToString() + extra


def test_decode_packed_equals_protobuf():
    o = np.arange(6000, dtype=np.float32).tobytes()
    resp, buf = reply(o, [0, 5, 0])
    # unknown fields at the top level and inside o, and a second o occurrence (merged: the
    # last data wins, the shapes concatenate)
    data_key = bytes([wire._DATA << 3 | 2])
    extra = (b"\xf8\x07\x01"                         # field 127, varint
             + b"\x12\x03" + b"\xa8\x1f\x05"           # o: its unknown field 501, varint
             + b"\xa2\x06\x02hi"                      # field 100, length-delimited
             + b"\x12\x06" + data_key + b"\x04\x01\x02\x03\x04")  # o again: new data
    buf += extra
    full = spb.ExtendBatchResponse.FromString(buf)
    msg, span = wire.decode_packed(buf)
    assert bytes(buf[span[0]:span[1]]) == full.o.data == b"\x01\x02\x03\x04"
    full.o.data = b""
    assert msg == full
    assert msg.SerializeToString() == full.SerializeToString()
    assert msg.tag == 7 and [s.code for s in msg.steps] == [0, 5, 0]


def test_decode_packed_truncations():
    _, buf = reply(np.ones(64, np.float32).tobytes(), [0, 3])
    for n in range(len(buf)):
        cut = buf[:n]
        try:
            want = spb.ExtendBatchResponse.FromString(cut)
        except DecodeError:
            with pytest.raises(ac.Internal):
                wire.decode_packed(cut)
            continue
        msg, span = wire.decode_packed(cut)
        data = b"" if span is None else bytes(cut[span[0]:span[1]])
        assert data == want.o.data
        if want.HasField("o"):
            want.o.data = b""
        assert msg == want


def test_packed_finish_per_step_errors_and_lengths(offline):
    a, b, c = (handle(offline, "float32", i) for i in (1, 2, 3))
    q = np.ones((3, 1, 1), np.float32)
    call, _ = offline._packed_request(0, [(a, 0, 1), (b, 0, 1), (c, 0, 1)], q, q, q, False,
                                      None, None, 0, Phases())
    o = np.array([1.5, 0.0, 2.5], np.float32).tobytes()
    resp, buf = reply(o, [0, 9, 0])
    r = offline._packed_finish(call, *offline._packed_reply(buf, "ExtendBatch"),
                               "ExtendBatch", Phases())
    assert r.o.tolist() == [[[1.5]], [[0.0]], [[2.5]]] and r.tag == 7
    assert isinstance(r.steps[1], ac.FailedPrecondition) and "step 1" in r.steps[1].details
    assert r.steps[0] == ac.StepResult(length=10, replayed=False, kv_len=10)
    assert (a.layer_lengths[0], b.layer_lengths[0], c.layer_lengths[0]) == (10, 0, 12)
    assert r.report.times_us["total"] == 42
    bad = spb.ExtendBatchResponse(code=3, message="malformed q", tag=7)
    with pytest.raises(ac.InvalidArgument, match="malformed q"):
        offline._packed_finish(call, bad, None, "ExtendBatchStream", Phases())
    short, _ = reply(o, [0, 0])
    with pytest.raises(ac.Internal, match="2 step results for 3 steps"):
        offline._packed_finish(call, short, None, "ExtendBatch", Phases())


def test_plan_chunks():
    rows, chunks = plan_chunks(3, 4, [True, False, True], None, 10, 1 << 20)
    assert rows == [(0, [0, 1, 2, 3]), (2, [0, 1, 2, 3])]
    assert chunks == [[(0, 0, [0, 1, 2, 3]), (2, 0, [0, 1, 2, 3])]]
    rows, chunks = plan_chunks(3, 4, [True] * 3, [[2, 3], None, []], 10, 1 << 20)
    assert rows == [(0, [2, 3]), (1, [0, 1, 2, 3])]
    assert chunks == [[(0, 0, [2, 3]), (1, 0, [0, 1, 2, 3])]]
    # 6 tokens over 2 rows at 10 bytes each, 40 bytes a call: 2 tokens per row per call
    rows, chunks = plan_chunks(2, 4, [True, True], [[1, 2, 3], None], 10, 40)
    assert chunks == [[(0, 0, [1, 2]), (1, 0, [0, 1])], [(0, 2, [3]), (1, 2, [2, 3])]]
    assert plan_chunks(2, 4, [False, False], None, 10, 40) == ([], [])
