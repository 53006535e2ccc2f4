"""The packed ExtendBatch, append-only steps, ExtendBatchStream (BatchStream) and host shared memory
(SharedRegion) of the Python client against the real server on the cpu backend.

Checked: extend_packed gives the per-step extend_batch's o and lengths bit for bit (numpy fp32,
and bf16 as uint16 bits), over the wire path and the protobuf path; per-step refusals (a wrong
position) come back in steps with zero rows while the other steps apply; append-only uploads
followed by attention equal a normal prefill; BatchStream with several batches in flight gives
each tag the unary results, and a request-level error (a sequence named twice) fails that
batch's future only; the asyncio client's extend_packed equals the blocking one; a SharedRegion
lease, and extend_packed through it equals inline.
Run: ATTN_SERVER_BIN=build-cpu/server/attention-server PYTHONPATH=client/python \\
     python3 -m pytest -q tests/python/test_client_packed.py
"""
import asyncio
import os
import re
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import attention_client as ac  # noqa: E402
from attention_client import AttentionClient  # noqa: E402
from attention_client.aio import AsyncAttentionClient  # noqa: E402
from live_server import LiveServer  # noqa: E402

N, K, H, LAYERS = 4, 2, 16, 2


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    with LiveServer("tcp", tmp_path_factory.mktemp("srv")) as s:
        yield s.target


@pytest.fixture(scope="module")
def client(target):
    with AttentionClient(target, timeout=30) as c:
        yield c


def make(rng, rows, heads, dtype):
    a = rng.standard_normal((rows, heads, H)).astype(np.float32)
    return ac.float32_to_bf16_bits(a) if dtype == "bfloat16" else a


def seqs(client, n, dtype):
    return [client.create_sequence(LAYERS, N, K, H, dtype=dtype) for _ in range(n)]


def split(x, ts):
    return np.split(x, np.cumsum(ts)[:-1])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("path", ["wire", "protobuf"])
def test_packed_equals_per_step(client, dtype, path):
    rng = np.random.default_rng(1)
    packed, single = seqs(client, 3, dtype), seqs(client, 3, dtype)
    client.wire = path == "wire"
    try:
        for ts in ([5, 1, 3], [1, 1, 1], [2, 4, 1]):
            total = sum(ts)
            q, k, v = make(rng, total, N, dtype), make(rng, total, K, dtype), \
                make(rng, total, K, dtype)
            for layer in range(LAYERS):
                r = client.extend_packed(layer, [(s, None, t) for s, t in zip(packed, ts)],
                                         q, k, v)
                ref = client.extend_batch([(s, layer, None, qi, ki, vi) for s, qi, ki, vi in
                                           zip(single, split(q, ts), split(k, ts),
                                               split(v, ts))])
                assert r.o.dtype == q.dtype and r.o.shape == (total, N, H)
                np.testing.assert_array_equal(r.o, np.concatenate([x.o for x in ref]))
                assert [s.length for s in r.steps] == [x.length for x in ref]
                assert [s.kv_len for s in r.steps] == [x.length for x in ref]
                assert r.report.batch_size == 3
        assert [s.layer_lengths for s in packed] == [s.layer_lengths for s in single]
    finally:
        client.wire = True
        for s in packed + single:
            s.release()


def test_refused_step_gets_zero_rows_others_apply(client):
    rng = np.random.default_rng(2)
    a, b = seqs(client, 2, "float32")
    q, k, v = make(rng, 3, N, "float32"), make(rng, 3, K, "float32"), make(rng, 3, K, "float32")
    r = client.extend_packed(0, [(a, 0, 2), (b, 4, 1)], q, k, v)
    assert isinstance(r.steps[1], ac.FailedPrecondition)
    assert re.search(r"\b0\b", r.steps[1].details)  # the message gives the layer's length
    np.testing.assert_array_equal(r.o[2], 0)
    assert r.steps[0].length == 2 and np.abs(r.o[:2]).sum() > 0
    assert a.refresh().layer_lengths[0] == 2 and b.refresh().layer_lengths[0] == 0
    a.release(), b.release()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_append_only_then_attend_equals_prefill(client, dtype):
    rng = np.random.default_rng(3)
    up, full = seqs(client, 2, dtype), seqs(client, 2, dtype)
    ts = [6, 3]
    k, v = make(rng, 9, K, dtype), make(rng, 9, K, dtype)
    r = client.extend_packed(0, [(s, 0, t) for s, t in zip(up, ts)], None, k, v,
                             append_only=True)
    assert r.o is None and [s.length for s in r.steps] == ts
    client.extend_packed(0, [(s, 0, t) for s, t in zip(full, ts)], make(rng, 9, N, dtype), k, v)
    q1, k1, v1 = make(rng, 2, N, dtype), make(rng, 2, K, dtype), make(rng, 2, K, dtype)
    a = client.extend_packed(0, [(s, None, 1) for s in up], q1, k1, v1)
    b = client.extend_packed(0, [(s, None, 1) for s in full], q1, k1, v1)
    np.testing.assert_array_equal(a.o, b.o)
    assert [s.kv_len for s in a.steps] == [7, 4]
    with pytest.raises(ac.InvalidArgument, match="q must be None"):
        client.extend_packed(0, [(up[0], None, 1)], q1[:1], k1[:1], v1[:1], append_only=True)
    for s in up + full:
        s.release()


def test_batch_stream_in_flight_equals_unary(client):
    rng = np.random.default_rng(4)
    streamed, unary = seqs(client, 4, "float32"), seqs(client, 4, "float32")
    micro = [[0, 1], [2, 3]]  # two micro-batches of two sequences, alternating
    expected, futures = {}, {}
    with client.batch_stream(max_in_flight=3) as bs:
        tag = 10
        for layer in range(LAYERS):
            for m in micro:
                q, k, v = make(rng, 2, N, "float32"), make(rng, 2, K, "float32"), \
                    make(rng, 2, K, "float32")
                futures[tag] = bs.submit(layer, [(streamed[i], None, 1) for i in m], q, k, v,
                                         tag=tag)
                expected[tag] = client.extend_packed(
                    layer, [(unary[i], None, 1) for i in m], q, k, v)
                tag += 1
        results = {t: f.result(30) for t, f in futures.items()}
    for t, r in results.items():
        assert r.tag == t
        np.testing.assert_array_equal(r.o, expected[t].o)
        assert [s.length for s in r.steps] == [s.length for s in expected[t].steps]
    assert [s.refresh().layer_lengths for s in streamed] == [[1, 1]] * 4
    for s in streamed + unary:
        s.release()


def test_batch_stream_request_level_error_on_one_batch(client):
    rng = np.random.default_rng(5)
    a, b = seqs(client, 2, "float32")
    q, k, v = make(rng, 2, N, "float32"), make(rng, 2, K, "float32"), make(rng, 2, K, "float32")
    with client.batch_stream(max_in_flight=2) as bs:
        bad = bs.submit(0, [(a, 0, 1), (a, 0, 1)], q, k, v, tag=1)  # a sequence twice
        good = bs.submit(0, [(b, 0, 1), (a, 0, 1)], q, k, v, tag=2)
        with pytest.raises(ac.InvalidArgument):
            bad.result(30)
        r = good.result(30)
        assert [s.length for s in r.steps] == [1, 1]
        r2 = bs.extend(1, [(a, 0, 1)], q[:1], k[:1], v[:1], timeout=30)
        assert r2.steps[0].length == 1
    a.release(), b.release()


def test_async_extend_packed_equals_blocking(client, target):
    rng = np.random.default_rng(6)
    q, k, v = make(rng, 3, N, "float32"), make(rng, 3, K, "float32"), make(rng, 3, K, "float32")
    s1, s2 = seqs(client, 2, "float32")
    want = client.extend_packed(0, [(s1, 0, 3)], q, k, v)

    async def run():
        async with AsyncAttentionClient(target, timeout=30) as c:
            seq = await c.sequence(s2.id)
            return await c.extend_packed(0, [(seq, 0, 3)], q, k, v)
    got = asyncio.run(run())
    np.testing.assert_array_equal(got.o, want.o)
    assert got.steps[0].length == 3
    s1.release(), s2.release()


def test_shared_region_lease(client):
    with client.shared_region(1 << 16) as region:
        assert re.fullmatch(r"[0-9a-f]{32}", region.region_id) and region.alive
        name = region.name
        assert os.path.exists("/dev/shm/" + name[1:])
    assert not os.path.exists("/dev/shm/" + name[1:])
    assert not region.alive


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_shared_region_equals_inline(client, dtype):
    rng = np.random.default_rng(7)
    inl, shm = seqs(client, 2, dtype), seqs(client, 2, dtype)
    with client.shared_region(1 << 20) as region:
        for ts in ([4, 2], [1, 1]):
            total = sum(ts)
            q, k, v = make(rng, total, N, dtype), make(rng, total, K, dtype), \
                make(rng, total, K, dtype)
            a = client.extend_packed(0, [(s, None, t) for s, t in zip(inl, ts)], q, k, v)
            tm = {}
            b = client.extend_packed(0, [(s, None, t) for s, t in zip(shm, ts)], q, k, v,
                                     region=region, timings=tm)
            np.testing.assert_array_equal(a.o, b.o)
            assert [s.length for s in a.steps] == [s.length for s in b.steps]
            assert set(tm) >= {"gather_us", "encode_us", "rpc_us", "scatter_us"}
        up = client.extend_packed(1, [(shm[0], 0, 2)], None, k, v, append_only=True,
                                  region=region)
        assert up.o is None and up.steps[0].length == 2
    for s in inl + shm:
        s.release()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_cpu_inline_and_region_equal_numpy(client, dtype):
    """torch CPU tensors (the fast path's torch kind; CUDA goes the same way with one copy
    each direction, not run here): inline and through a region, o equal to the numpy path's
    bits, as a torch tensor of q's dtype. Needs torch."""
    torch = pytest.importorskip("torch", reason="torch tensors need torch")
    rng = np.random.default_rng(8)
    a, b, c = seqs(client, 3, dtype)
    q, k, v = make(rng, 3, N, dtype), make(rng, 3, K, dtype), make(rng, 3, K, dtype)
    want = client.extend_packed(0, [(a, 0, 3)], q, k, v).o

    def as_torch(x):
        t = torch.from_numpy(x.view(np.int16) if dtype == "bfloat16" else x)
        return t.view(torch.bfloat16) if dtype == "bfloat16" else t
    tq, tk, tv = as_torch(q), as_torch(k), as_torch(v)
    got = client.extend_packed(0, [(b, 0, 3)], tq, tk, tv).o
    with client.shared_region(1 << 16) as region:
        via = client.extend_packed(0, [(c, 0, 3)], tq, tk, tv, region=region).o
    for o in (got, via):
        assert isinstance(o, torch.Tensor) and o.dtype == tq.dtype
        bits = o.view(torch.int16).numpy() if dtype == "bfloat16" else o.numpy()
        np.testing.assert_array_equal(bits.view(want.dtype), want)
    for s in (a, b, c):
        s.release()
