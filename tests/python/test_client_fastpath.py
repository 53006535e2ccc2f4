"""attention_client's fast path (fastpath.py: bytes as they are, one gather / one scatter per
call), ExtendStream helper (stream.py) and asyncio client (aio.py) against the real server on
the cpu backend: the fast path gives exactly the old path's bytes and matches a float64 oracle;
numpy float32/float16/bfloat16 (uint16 bits, and ml_dtypes when installed), torch when installed.
Run: ATTN_SERVER_BIN=build/server/attention-server PYTHONPATH=client/python \\
     python3 -m pytest -q tests/python/test_client_fastpath.py
"""
import asyncio
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import attention_client as ac  # noqa: E402
from attention_client import AttentionClient  # noqa: E402
from attention_client.aio import AsyncAttentionClient  # noqa: E402
from live_server import LiveServer  # noqa: E402

N, K, H = 4, 2, 16


@pytest.fixture(scope="module", params=["tcp", "unix"])
def target(request, tmp_path_factory):
    with LiveServer(request.param, tmp_path_factory.mktemp("srv")) as s:
        yield s.target


@pytest.fixture(scope="module")
def client(target):
    with AttentionClient(target, timeout=30) as c:
        yield c


def oracle(qs, ks, vs):
    """Steps of one sequence layer (lists of (T,N,H)/(T,K,H) float arrays) → list of o float64:
    step rows see every earlier key and their own prefix (bottom-right causal)."""
    out, kc, vc = [], np.zeros((0, K, H)), np.zeros((0, K, H))
    for q, k, v in zip(qs, ks, vs):
        q = np.asarray(q, np.float64)
        kc = np.concatenate([kc, np.asarray(k, np.float64)])
        vc = np.concatenate([vc, np.asarray(v, np.float64)])
        T, S = q.shape[0], kc.shape[0]
        o = np.zeros((T, N, H))
        for n in range(N):
            s = q[:, n] @ kc[:, n // (N // K)].T / np.sqrt(H)
            s = np.where(np.arange(S)[None, :] <= np.arange(T)[:, None] + S - T, s, -np.inf)
            w = np.exp(s - s.max(axis=1, keepdims=True))
            o[:, n] = (w / w.sum(axis=1, keepdims=True)) @ vc[:, n // (N // K)]
        out.append(o)
    return out


def steps_data(seed, lengths, dtype):
    """Per sequence, per step: (q, k, v) float32 arrays with values exact in `dtype`."""
    rng = np.random.default_rng(seed)
    out = []
    for steps in lengths:
        seq = []
        for t in steps:
            a = [rng.standard_normal((t, n, H)).astype(np.float32) for n in (N, K, K)]
            if dtype == "bfloat16":
                a = [ac.round_to_bf16(x) for x in a]
            elif dtype == "float16":
                a = [x.astype(np.float16).astype(np.float32) for x in a]
            seq.append(a)
        out.append(seq)
    return out


def as_wire(a, kind):
    """float32 array → the array the test sends: float32, float16 or bf16 uint16 bits."""
    if kind == "float32":
        return a
    if kind == "float16":
        return a.astype(np.float16)
    return ac.float32_to_bf16_bits(a)


def run_batches(client, data, dtype, convert, fast):
    """Creates one sequence per entry of data, runs step i of every sequence as ExtendBatch i
    (layer 0), returns per sequence the list of o, and releases the sequences."""
    seqs = [client.create_sequence(1, N, K, H, dtype=dtype) for _ in data]
    try:
        outs = [[] for _ in data]
        for i in range(len(data[0])):
            steps = [(s, 0, None, *[convert(x) for x in d[i]]) for s, d in zip(seqs, data)]
            res = client.extend_batch(steps, fast=fast)
            for j, r in enumerate(res):
                assert not isinstance(r, Exception), r
                outs[j].append(r.o)
        return outs
    finally:
        for s in seqs:
            s.release()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_numpy_fast_equals_old_and_oracle(client, dtype):
    data = steps_data(1, [[5, 1, 1, 3], [2, 1, 1, 1], [7, 1, 2, 1]], dtype)
    fast = run_batches(client, data, dtype, lambda a: as_wire(a, dtype), True)
    old = run_batches(client, data, dtype, lambda a: a, False)  # float32 in, converted
    tol = {"float32": 1e-5, "float16": 3e-3, "bfloat16": 2e-2}[dtype]
    for d, fo, oo in zip(data, fast, old):
        ref = oracle(*zip(*d))
        for f, o, r in zip(fo, oo, ref):
            if dtype == "bfloat16":
                assert f.dtype == np.uint16  # bits in, bits out
                f = ac.bf16_bits_to_float32(f)
            assert f.dtype == np.asarray(o).dtype or dtype == "bfloat16"
            assert np.array_equal(np.asarray(f, np.float32), np.asarray(o, np.float32))
            np.testing.assert_allclose(np.asarray(f, np.float64), r, atol=tol, rtol=tol)


def test_fast_outputs_are_views_of_one_buffer(client):
    data = steps_data(2, [[3], [4]], "float16")
    seqs = [client.create_sequence(1, N, K, H, dtype="float16") for _ in data]
    res = client.extend_batch([(s, 0, None, *[a.astype(np.float16) for a in d[0]])
                               for s, d in zip(seqs, data)])
    assert res[0].o.base is not None and res[0].o.base is res[1].o.base
    assert res[0].o.shape == (3, N, H) and res[1].o.shape == (4, N, H)
    assert [s.layer_lengths for s in seqs] == [[3], [4]]
    for s in seqs:
        s.release()


def test_fast_true_refuses_what_it_cannot_take(client):
    with client.create_sequence(1, N, K, H, dtype="float16") as s:
        q, k, v = steps_data(3, [[1]], "float16")[0][0]  # float32 arrays: not the wire dtype
        with pytest.raises(ac.InvalidArgument, match="fast path cannot take"):
            client.extend_batch([(s, 0, None, q, k, v)], fast=True)
        assert s.layer_lengths == [0]  # nothing sent
        r = client.extend_batch([(s, 0, None, q, k, v)])[0]  # fast=None: the old path
        assert r.length == 1 and r.o.dtype == np.float16
        with pytest.raises(ac.InvalidArgument, match="empty tensor"):
            client.extend_batch([(s, 0, None, q[:0].astype(np.float16),
                                  k[:0].astype(np.float16), v[:0].astype(np.float16))])


def test_failed_step_keeps_the_others(client):
    data = steps_data(4, [[2], [2]], "float16")
    seqs = [client.create_sequence(1, N, K, H, dtype="float16") for _ in data]
    steps = [(s, 0, pos, *[a.astype(np.float16) for a in d[0]])
             for s, d, pos in zip(seqs, data, (0, 5))]
    res = client.extend_batch(steps)
    assert isinstance(res[1], ac.FailedPrecondition)
    ref = oracle(*zip(*data[0]))[0]
    np.testing.assert_allclose(res[0].o.astype(np.float64), ref, atol=3e-3, rtol=3e-3)
    for s in seqs:
        s.release()


def test_sequence_extend_fast_equals_old(client):
    d = steps_data(5, [[4, 1, 1]], "bfloat16")[0]
    outs = []
    for fast, conv in ((True, lambda a: as_wire(a, "bfloat16")), (False, lambda a: a)):
        with client.create_sequence(1, N, K, H, dtype="bfloat16") as s:
            outs.append([np.asarray(s.extend(0, None, *[conv(x) for x in st], fast=fast).o)
                         for st in d])
    for f, o in zip(*outs):
        assert np.array_equal(ac.bf16_bits_to_float32(f), np.asarray(o, np.float32))


def test_stream_three_in_flight(client):
    data = steps_data(6, [[3, 1, 1], [2, 1, 1], [5, 1, 1]], "float16")
    want = run_batches(client, data, "float16", lambda a: a.astype(np.float16), True)
    seqs = [client.create_sequence(1, N, K, H, dtype="float16") for _ in data]
    with client.extend_stream(max_in_flight=3) as st:
        for i in range(3):
            futs = [st.submit(s, 0, None, *[a.astype(np.float16) for a in d[i]])
                    for s, d in zip(seqs, data)]
            for j, f in enumerate(futs):
                assert np.array_equal(f.result(timeout=30).o, want[j][i])
        bad = st.submit(seqs[0], 0, 99, *[a.astype(np.float16) for a in data[0][1]])
        with pytest.raises(ac.FailedPrecondition):
            bad.result(timeout=30)
        r = st.extend(seqs[1], 0, None, *[a.astype(np.float16) for a in data[1][1]])
        assert r.length == 2 + 1 + 1 + 1  # the stream goes on after a failed step
    assert [s.refresh().layer_lengths for s in seqs] == [[5], [5], [7]]
    for s in seqs:
        s.release()


def test_asyncio_client(target):
    data = steps_data(7, [[3, 1], [2, 1]], "bfloat16")

    async def main():
        async with AsyncAttentionClient(target, timeout=30) as c:
            assert (await c.load()).worker_threads >= 1
            q = np.ones((1, 2, N, H), np.float32)
            r = await c.attend(q, q[:, :, :K], q[:, :, :K])
            np.testing.assert_allclose(r.o, 1.0, rtol=1e-6)
            seqs = [await c.create_sequence(1, N, K, H, dtype="bfloat16") for _ in data]
            outs = [[] for _ in data]
            res = await c.extend_batch([(s, 0, None, *[as_wire(a, "bfloat16") for a in d[0]])
                                        for s, d in zip(seqs, data)])
            for j, x in enumerate(res):
                outs[j].append(x.o)
            async with c.extend_stream() as st:
                futs = [await st.submit(s, 0, None, *[as_wire(a, "bfloat16") for a in d[1]])
                        for s, d in zip(seqs, data)]
                for j, f in enumerate(futs):
                    outs[j].append((await f).o)
            one = await seqs[0].extend(0, None, *[as_wire(a, "bfloat16") for a in data[0][1]])
            assert one.length == 5 and one.o.dtype == np.uint16
            lengths = [(await s.refresh()).layer_lengths for s in seqs]
            for s in seqs:
                await s.release()
            return outs, lengths

    outs, lengths = asyncio.run(main())
    assert [list(x) for x in lengths] == [[5], [3]]
    for d, o in zip(data, outs):
        for f, r in zip(o, oracle(*zip(*d))):
            np.testing.assert_allclose(ac.bf16_bits_to_float32(f), r, atol=2e-2, rtol=2e-2)


def test_ml_dtypes_bfloat16(client):
    ml = pytest.importorskip("ml_dtypes")
    d = steps_data(8, [[3, 1]], "bfloat16")
    fast = run_batches(client, d, "bfloat16", lambda a: a.astype(ml.bfloat16), True)
    old = run_batches(client, d, "bfloat16", lambda a: a, False)
    for f, o in zip(fast[0], old[0]):
        assert f.dtype == ml.bfloat16
        assert np.array_equal(f.astype(np.float32), np.asarray(o, np.float32))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_fast_equals_old(client, device, dtype):
    torch = pytest.importorskip("torch")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    tdt = getattr(torch, dtype)
    data = steps_data(9, [[4, 1, 1], [2, 1, 1]], dtype)
    conv = lambda a: torch.from_numpy(a).to(device=device, dtype=tdt)  # noqa: E731
    fast = run_batches(client, data, dtype, conv, True)
    old = run_batches(client, data, dtype, conv, False)
    for d, fo, oo in zip(data, fast, old):
        for f, o, r in zip(fo, oo, oracle(*zip(*d))):
            assert f.dtype == tdt and f.device.type == device
            assert torch.equal(f, o)
            np.testing.assert_allclose(f.float().cpu().numpy(), r, atol=2e-2, rtol=2e-2)
