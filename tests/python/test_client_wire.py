"""attention_client.wire (the fast path's own wire encoder/decoder) against protobuf itself, and
extend_batch / Extend / ExtendStream over the wire path vs the protobuf paths on a live server.

Encoder: the bytes parse into exactly the message the protobuf fast path and the old path
build (and equal protobuf's serialisation), for fp32/fp16/bf16, numpy and torch CPU, 1 and 32
steps, odd and non-contiguous shapes, multi-byte length varints, empty sequence ids.
Decoder: identical to protobuf parsing for mixed OK/error replies, unknown fields of every wire
type at every level, repeated occurrences (merged / last wins); every truncation and seeded
byte corruption either parses as protobuf does or raises Internal.
Run: ATTN_SERVER_BIN=build/server/attention-server PYTHONPATH=client/python \\
     python3 -m pytest -q tests/python/test_client_wire.py
"""
import os
import random
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import attention_client as ac  # noqa: E402
from attention_client import AttentionClient, wire  # noqa: E402
from attention_client._pb import attention_pb2 as pb  # noqa: E402
from attention_client._pb import sequence_pb2 as spb  # noqa: E402
from attention_client.sequence import Sequence  # noqa: E402
from google.protobuf.message import DecodeError  # noqa: E402
from live_server import LiveServer  # noqa: E402

DT = {"float32": pb.FLOAT32, "float16": pb.FLOAT16, "bfloat16": pb.BFLOAT16}


@pytest.fixture(params=["walk", "whole"])
def walk(request, monkeypatch):
    """Replies of every size walked by the wire decoder ("walk"), or the default threshold
    (small test replies parsed whole by protobuf)."""
    if request.param == "walk":
        monkeypatch.setattr(wire, "WALK_MIN_BYTES", 0)
    return request.param


@pytest.fixture(scope="module")
def offline():
    """A client whose channel never connects (the encoder needs only its handles)."""
    with AttentionClient("127.0.0.1:9", timeout=1) as c:
        yield c


def handle(client, dtype, seq_id="ab" * 16, length=0):
    info = spb.SequenceInfo(sequence_id=seq_id, num_layers=2, dtype=DT[dtype],
                            layer_lengths=[length, length])
    return Sequence(client, info)


def tensors(rng, shape, dtype, kind, transpose=False):
    """A float32 array of values exact in dtype, and its wire form of `kind`."""
    a = rng.standard_normal(shape).astype(np.float32)
    a = ac.round_to_bf16(a) if dtype == "bfloat16" else a.astype(dtype).astype(np.float32)
    if transpose:  # non-contiguous view of the same shape
        a = np.ascontiguousarray(a.transpose(0, 2, 1)).transpose(0, 2, 1)
    if kind == "numpy":
        w = a if dtype == "float32" else (a.astype(np.float16) if dtype == "float16"
                                          else ac.float32_to_bf16_bits(a))
        if transpose:
            w = np.ascontiguousarray(w.transpose(0, 2, 1)).transpose(0, 2, 1)
        return a, w
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(a).to(getattr(torch, dtype))
    return a, (t.transpose(1, 2).contiguous().transpose(1, 2) if transpose else t)


def make_steps(client, rng, dtype, kind, shapes, ids=None):
    """(wire steps, float32 steps) for one ExtendBatch; shapes: (T, N, K, H) per step."""
    wsteps, fsteps = [], []
    for i, (t, n, k, h) in enumerate(shapes):
        s = handle(client, dtype, seq_id=(ids[i] if ids else f"{i:032x}"), length=i)
        qkv = [tensors(rng, (t, heads, h), dtype, kind, transpose=(i % 3 == 2))
               for heads in (n, k, k)]
        pos = None if i % 2 else 1000 + i
        wsteps.append((s, i % 2, pos, *[w for _, w in qkv]))
        fsteps.append((s, i % 2, pos, *[a for a, _ in qkv]))
    return wsteps, fsteps


def batch_bytes(client, steps, use_wire):
    p = client._plan(steps, True)
    client.wire = use_wire
    try:
        return client._batch_request(steps, p)
    finally:
        client.wire = True


SHAPES_1 = [(3, 6, 3, 5)]
SHAPES_32 = [(1 + (i * 7) % 9, 4, 2, 3 + i % 4) for i in range(32)]
SHAPES_BIG = [(512, 32, 8, 64), (1, 1, 1, 1)]  # a 2 MiB q: 4-byte length varints


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("shapes", [SHAPES_1, SHAPES_32, SHAPES_BIG], ids=["1", "32", "big"])
def test_encoder_equals_protobuf(offline, dtype, kind, shapes):
    rng = np.random.default_rng(len(shapes))
    wsteps, fsteps = make_steps(offline, rng, dtype, kind, shapes)
    raw = batch_bytes(offline, wsteps, True)
    assert isinstance(raw, bytes)
    msg = batch_bytes(offline, wsteps, False)  # the protobuf fast path
    old = offline._batch_request(fsteps, None)  # the old path: float32 converted
    parsed = spb.ExtendBatchRequest.FromString(raw)
    assert parsed == msg and parsed == old
    assert raw == msg.SerializeToString()  # field order: protobuf's own bytes
    assert [s.position for s in parsed.steps][:2] == [1000, 1][:len(shapes)]
    one = offline._step_request(wsteps[0], offline._plan(wsteps[:1], True))
    assert isinstance(one, bytes) and spb.ExtendRequest.FromString(one) == msg.steps[0]


def test_encoder_empty_sequence_id_and_refusals(offline):
    rng = np.random.default_rng(3)
    ws, _ = make_steps(offline, rng, "float16", "numpy", SHAPES_1 * 2, ids=["", "x"])
    raw = batch_bytes(offline, ws, True)
    assert raw == batch_bytes(offline, ws, False).SerializeToString()
    assert spb.ExtendBatchRequest.FromString(raw).steps[0].sequence_id == ""
    empty = (ws[0][0], 0, 0, ws[0][3][:0], ws[0][4][:0], ws[0][5][:0])
    with pytest.raises(ac.InvalidArgument, match="empty tensor"):
        offline._batch_request([empty], offline._plan([empty], True))


def test_field_numbers_come_from_descriptors():
    assert wire._DATA == pb.Tensor.DESCRIPTOR.fields_by_name["data"].number
    assert wire._QKV == tuple(spb.ExtendRequest.DESCRIPTOR.fields_by_name[n].number
                              for n in "qkv")
    assert wire.PATHS["ExtendBatch"] == "/attention.v1.SequenceService/ExtendBatch"


# -- decoder ------------------------------------------------------------------------------------
def key(field, wt):
    return wire.varint(field << 3 | wt)


def ld(field, payload):
    return key(field, 2) + wire.varint(len(payload)) + payload


UNKNOWN = [key(901, 0) + wire.varint(300), key(902, 1) + b"\x01" * 8, ld(903, b"junk\x00"),
           key(904, 3) + key(1, 0) + b"\x05" + key(2, 3) + key(2, 4) + key(904, 4),
           key(905, 5) + b"\x02" * 4]


def with_unknown(msg, rng):
    """msg.SerializeToString() with unknown fields of every wire type at random boundaries
    (appended and prepended; field order does not matter to protobuf)."""
    extra = list(UNKNOWN)
    rng.shuffle(extra)
    return extra[0] + extra[1] + msg.SerializeToString() + b"".join(extra[2:])


def sample_reply(rng, n, unknown, data_twice=False):
    """Serialised ExtendBatchResponse with n results (every third an error: code 9)."""
    out = b""
    for i in range(n):
        if i % 3 == 1:
            r = spb.ExtendResult(code=9, message=f"step {i}: position 5, length 0 ✓")
            body = with_unknown(r, rng) if unknown else r.SerializeToString()
            out += ld(1, body)
            continue
        data = rng.randbytes(2 * (i + 1) * 4)
        t = pb.Tensor(dtype=pb.FLOAT16, shape=[i + 1, 2, 2])
        tb = (with_unknown(t, rng) if unknown else t.SerializeToString())
        if data_twice:
            tb += ld(3, b"\xff" * len(data))
        tb += ld(3, data)
        rep = pb.ExecutionReport(backend="cpu", batch_size=n, flops=1.5 * i,
                                 times=pb.PhaseTimes(kernel_us=i, total_us=7 * i))
        resp = spb.ExtendResponse(length=10 + i, replayed=bool(i % 2), report=rep)
        rb = ld(1, tb) + (with_unknown(resp, rng) if unknown else resp.SerializeToString())
        res = spb.ExtendResult(code=0)
        out += ld(1, ld(3, rb) + (with_unknown(res, rng) if unknown else res.SerializeToString()))
    if unknown:
        out = UNKNOWN[3] + out + UNKNOWN[0]
    return out


def rebuilt(buf, entries):
    """decode_batch entries → full ExtendResult messages (o.data put back from its span)."""
    out = []
    for msg, span in entries:
        m = spb.ExtendResult()
        m.CopyFrom(msg)
        if span is not None:
            m.response.o.data = buf[span[0]:span[1]]
        out.append(m)
    return out


def same(a, b):
    for m in a + b:
        m.DiscardUnknownFields()
    return a == b


@pytest.mark.parametrize("unknown", [False, True])
@pytest.mark.parametrize("n", [1, 7, 32])
def test_decoder_equals_protobuf(n, unknown):
    rng = random.Random(n)
    buf = sample_reply(rng, n, unknown)
    want = list(spb.ExtendBatchResponse.FromString(buf).results)
    entries = wire.decode_batch(buf)
    assert len(entries) == n
    assert same(rebuilt(buf, entries), want)
    for (msg, span), w in zip(entries, want):
        assert msg.response.o.data == b""  # never copied out by the decoder
        assert (span is None) == (w.code != 0)
        assert msg.code == w.code and msg.message == w.message
        assert msg.HasField("response") == w.HasField("response")


def test_untimed_steps_report_no_device_phases():
    """PhaseTimes.device_untimed (a GPU step replayed without timing events) reaches
    Report.device_timed, and a layer call's server phases leave its device phases out."""
    from attention_client.layer_calls import _merge_server
    from attention_client.report import Report
    times = pb.PhaseTimes(kernel_us=0, queue_us=4, total_us=80, device_untimed=True)
    untimed = Report.from_pb(pb.ExecutionReport(backend="paged-gpu", times=times))
    timed = Report.from_pb(pb.ExecutionReport(
        backend="paged-gpu", times=pb.PhaseTimes(kernel_us=16, queue_us=2, total_us=90)))
    assert not untimed.device_timed and timed.device_timed
    server = {}
    _merge_server(server, untimed)
    assert "kernel" not in server and "host_to_device" not in server
    assert server["queue"] == 4 and server["total"] == 80
    _merge_server(server, timed)
    assert server["kernel"] == 16 and server["total"] == 90


def test_decoder_repeated_occurrences_merge_like_protobuf():
    rng = random.Random(5)
    buf = sample_reply(rng, 4, True, data_twice=True)
    res = ld(1, ld(3, ld(1, pb.Tensor(shape=[2]).SerializeToString() + ld(3, b"ab")))
             + ld(3, ld(1, pb.Tensor(shape=[3]).SerializeToString() + ld(3, b"cd"))
                  + spb.ExtendResponse(length=4).SerializeToString()))
    buf += res
    want = list(spb.ExtendBatchResponse.FromString(buf).results)
    assert list(want[-1].response.o.shape) == [2, 3] and want[-1].response.o.data == b"cd"
    assert same(rebuilt(buf, wire.decode_batch(buf)), want)
    one = wire.decode_result(spb.ExtendResult(code=5).SerializeToString())
    assert one[0].code == 5 and one[1] is None


def protobuf_verdict(buf):
    try:
        return list(spb.ExtendBatchResponse.FromString(buf).results)
    except DecodeError:
        return None


def check_like_protobuf(buf):
    want = protobuf_verdict(buf)
    try:
        got = rebuilt(buf, wire.decode_batch(buf))
    except ac.Internal as e:
        assert "malformed response" in str(e)
        assert want is None, f"wire refused what protobuf parses: {buf!r}"
        return
    assert want is not None, f"wire parsed what protobuf refuses: {buf!r}"
    assert same(got, want)


def test_decoder_truncations_and_garbage_raise_internal():
    buf = sample_reply(random.Random(7), 4, True)
    for cut in range(len(buf)):  # every prefix
        check_like_protobuf(buf[:cut])
    rng = random.Random(11)
    for _ in range(1500):  # seeded byte corruptions (1-3 bytes each)
        b = bytearray(buf)
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        check_like_protobuf(bytes(b))
    for bad in (b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # 11-byte varint
                b"\x0a\x05\x1a\x03\x0a\x09", b"\x0e\x00", key(1, 3) + key(2, 4),
                b"\x00\x00", key(5, 4)):
        with pytest.raises(ac.Internal):
            wire.decode_batch(bad)


def test_garbled_reply_through_the_client_raises_internal_only(offline, walk):
    """_batch_results on corrupted replies: results (as protobuf says) or Internal, nothing
    else (no IndexError, no garbage o)."""
    rng = np.random.default_rng(4)
    ws, _ = make_steps(offline, rng, "float16", "numpy", [(i + 1, 2, 2, 2) for i in range(4)])
    p = offline._plan(ws, True)
    buf = sample_reply(random.Random(9), 4, True)
    good = offline._batch_results(ws, buf, p)
    assert [type(r).__name__ for r in good] == ["ExtendResult", "FailedPrecondition",
                                                "ExtendResult", "ExtendResult"]
    want = spb.ExtendBatchResponse.FromString(buf).results
    assert bytes(good[3].o.view(np.uint8).reshape(-1)) == want[3].response.o.data
    r = random.Random(12)
    for _ in range(300):
        b = bytearray(buf)
        b[r.randrange(len(b))] = r.randrange(256)
        try:
            offline._batch_results(ws, bytes(b), p)
        except ac.Internal:
            pass
        except ac.AttentionError as e:
            pytest.fail(f"not Internal: {e!r}")


# -- live server: wire path vs protobuf paths -------------------------------------------------
@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with LiveServer("tcp", tmp_path_factory.mktemp("srv")) as s:
        with AttentionClient(s.target, timeout=30) as c:
            yield c


N, K, H = 4, 2, 8


def run(client, dtype, kind, mode, lengths):
    """Per ExtendBatch i, the results (o as uint8 bytes, length, code) of every sequence;
    mode: "wire", "protobuf" (fast, client.wire False) or "old" (fast=False)."""
    rng = np.random.default_rng(21)
    seqs = [client.create_sequence(1, N, K, H, dtype=dtype) for _ in lengths[0]]
    client.wire = mode == "wire"
    out, timings = [], {}
    try:
        for i, ls in enumerate(lengths):
            steps = []
            for j, (s, t) in enumerate(zip(seqs, ls)):
                qkv = [tensors(rng, (t, n, H), dtype, kind)[0 if mode == "old" else 1]
                       for n in (N, K, K)]
                steps.append((s, 0, 999 if (i, j) == (1, 1) else None, *qkv))
            res = client.extend_batch(steps, fast=mode != "old", timings=timings)
            out.append([(type(r).__name__, str(r)) if isinstance(r, ac.AttentionError) else
                        (r.length, r.replayed, raw_bytes(r.o, dtype)) for r in res])
    finally:
        client.wire = True
        for s in seqs:
            s.release()
    return out, timings


def raw_bytes(o, dtype):
    if isinstance(o, np.ndarray):
        a = np.asarray(o)
        return (a.astype(np.float16) if dtype == "float16" else
                ac.float32_to_bf16_bits(a) if dtype == "bfloat16" and a.dtype != np.uint16
                else a).tobytes()
    import torch
    return o.contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_live_extend_batch_wire_equals_protobuf(live, dtype, kind, walk):
    if kind == "torch":
        pytest.importorskip("torch")
    lengths = [[5, 3] + [1 + j % 4 for j in range(30)], [1] * 32, [2] * 32]
    w, wt = run(live, dtype, kind, "wire", lengths)
    assert "ExtendBatch" in live._raw_calls  # the raw-bytes callable carried it
    pbuf, _ = run(live, dtype, kind, "protobuf", lengths)
    old, _ = run(live, dtype, "numpy", "old", lengths)
    assert w == pbuf  # bitwise, errors included (step 1 of batch 1 is refused)
    assert w[1][1][0] == "FailedPrecondition" and isinstance(w[2][0][2], bytes)
    assert w == old  # same values from the same seed: the old path's bytes too
    assert set(wt) == set(ac.extend_calls.PHASES) and all(v > 0 for v in wt.values())


def test_live_extend_and_stream_wire_equals_protobuf(live, walk):
    rng = np.random.default_rng(5)
    steps = [[tensors(rng, (t, n, H), "bfloat16", "numpy")[1] for n in (N, K, K)]
             for t in (4, 1, 2)]
    got = {}
    for use_wire in (True, False):
        live.wire = use_wire
        try:
            with live.create_sequence(1, N, K, H, dtype="bfloat16") as s:
                one = [s.extend(0, None, *x).o.tobytes() for x in steps[:2]]
                with live.extend_stream() as st:
                    futs = [st.submit(s, 0, None, *steps[2]),
                            st.submit(s, 0, 0, *steps[2])]  # refused: position 0
                    one.append(futs[0].result(timeout=30).o.tobytes())
                    with pytest.raises(ac.FailedPrecondition):
                        futs[1].result(timeout=30)
                    one.append(st.extend(s, 0, None, *steps[1], fast=False).length)
                got[use_wire] = one
        finally:
            live.wire = True
    assert got[True] == got[False] and got[True][-1] == 8


def test_live_asyncio_wire_equals_protobuf(live, walk):
    import asyncio
    from attention_client.aio import AsyncAttentionClient
    rng = np.random.default_rng(6)
    data = [[tensors(rng, (t, n, H), "float16", "numpy")[1] for n in (N, K, K)]
            for t in (3, 2, 1)]

    async def main(use_wire):
        async with AsyncAttentionClient(live.target, timeout=30) as c:
            c.wire = use_wire
            seqs = [await c.create_sequence(1, N, K, H, dtype="float16") for _ in range(2)]
            tm = {}
            res = await c.extend_batch([(s, 0, None, *data[i]) for i, s in enumerate(seqs)],
                                       timings=tm)
            out = [r.o.tobytes() for r in res]
            out.append((await seqs[0].extend(0, None, *data[2])).o.tobytes())
            async with c.extend_stream() as st:
                out.append((await (await st.submit(seqs[1], 0, None, *data[2]))).o.tobytes())
            for s in seqs:
                await s.release()
            return out, tm, "ExtendBatch" in getattr(c, "_raw_calls", {})

    w, tm, raw = asyncio.run(main(True))
    p, _, raw_p = asyncio.run(main(False))
    assert w == p and raw and not raw_p
    assert set(tm) == set(ac.extend_calls.PHASES)


@pytest.mark.parametrize("use_wire", [True, False])
def test_live_wire_keeps_metadata_limits_and_errors(live, use_wire):
    """The raw-bytes callables send the same identity metadata (another identity's sequence
    is NotFound per step) and map request-level failures the same way (a request over the
    channel's send limit: ResourceExhausted)."""
    rng = np.random.default_rng(8)
    qkv = [tensors(rng, (4, n, H), "float16", "numpy")[1] for n in (N, K, K)]
    with AttentionClient(live.target, timeout=30, identity="alice") as a, \
            AttentionClient(live.target, timeout=30, identity="bob") as b, \
            AttentionClient(live.target, timeout=30, identity="alice",
                            max_message_bytes=256) as small:
        for c in (a, b, small):
            c.wire = use_wire
        with a.create_sequence(1, N, K, H, dtype="float16") as s:
            r = b.extend_batch([(s, 0, 0, *qkv)], fast=True)[0]
            assert isinstance(r, ac.NotFound), r
            with pytest.raises(ac.ResourceExhausted):
                small.extend_batch([(s, 0, 0, *qkv)], fast=True)
            with pytest.raises(ac.ResourceExhausted):
                Sequence(small, s.info).extend(0, 0, *qkv, fast=True)
            ok = a.extend_batch([(s, 0, 0, *qkv)], fast=True)[0]
            assert ok.length == 4 and s.layer_lengths == [4]
        assert ("ExtendBatch" in getattr(b, "_raw_calls", {})) == use_wire
