"""attention_client (client/python) against the real attention-server (cpu backend), checked
against a numpy float64 oracle written here.

Run: ATTN_SERVER_BIN=build/server/attention-server PYTHONPATH=client/python \
     python3 -m pytest -q tests/python/test_client_api.py
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

import grpc
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import attention_client as ac  # noqa: E402
from attention_client import AttentionClient  # noqa: E402

SERVER = os.environ.get("ATTN_SERVER_BIN", "build/server/attention-server")


@pytest.fixture(scope="module")
def target():
    with tempfile.TemporaryDirectory() as tmp:
        port_file = os.path.join(tmp, "port")
        proc = subprocess.Popen([SERVER, "--listen", "127.0.0.1:0", "--port-file", port_file,
                                 "--default-backend", "cpu", "--max-message-bytes", "1000000",
                                 "--log-level", "warn"],
                                stderr=subprocess.PIPE)
        try:
            for _ in range(300):
                if os.path.exists(port_file) and open(port_file).read().strip():
                    break
                assert proc.poll() is None, proc.stderr.read().decode()
                time.sleep(0.1)
            yield f"127.0.0.1:{int(open(port_file).read())}"
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0


@pytest.fixture(scope="module")
def client(target):
    with AttentionClient(target, timeout=30) as c:
        yield c


# ---- the oracle -----------------------------------------------------------------------------

def oracle(q, k, v, causal=None, window=(None, None), q_lengths=None, kv_lengths=None,
           scale=None):
    """Padded (B,T,N,H)/(B,S,K,H) attention in float64 → (o (B,T,N,H), lse (B,N,T))."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    scale = 1 / np.sqrt(H) if scale is None else scale
    o = np.zeros((B, T, N, H))
    lse = np.full((B, N, T), -np.inf)
    for b in range(B):
        tb = T if q_lengths is None else q_lengths[b]
        sb = S if kv_lengths is None else kv_lengths[b]
        i = np.arange(tb)[:, None]
        j = np.arange(sb)[None, :]
        d = i if causal == "top_left" else i + (sb - tb)
        keep = np.ones((tb, sb), bool)
        if causal is not None:
            keep &= j <= d
        if window[0] is not None:
            keep &= j >= d - window[0]
        if window[1] is not None:
            keep &= j <= d + window[1]
        for n in range(N):
            kh = n // (N // K)
            s = scale * q[b, :tb, n] @ k[b, :sb, kh].T
            s = np.where(keep, s, -np.inf)
            m = s.max(axis=1, keepdims=True) if sb else np.full((tb, 1), -np.inf)
            rows = np.isfinite(m[:, 0])
            p = np.zeros_like(s)
            p[rows] = np.exp(s[rows] - m[rows])
            den = p.sum(axis=1)
            o[b, :tb, n][rows] = (p[rows] @ v[b, :sb, kh]) / den[rows, None]
            lse[b, n, :tb][rows] = m[rows, 0] + np.log(den[rows])
    return o, lse


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def pack(x, lengths):
    return np.concatenate([x[b, :n] for b, n in enumerate(lengths)], axis=0)


# ---- stateless ------------------------------------------------------------------------------

def test_server_info(client):
    info = client.server_info()
    names = {b.name: b for b in info.backends}
    assert names["cpu"].available
    assert info.max_message_bytes == 1000000


def test_padded_basic_fp32_with_lse(client):
    rng = np.random.default_rng(0)
    q, k, v = rand(rng, 2, 5, 4, 16), rand(rng, 2, 7, 4, 16), rand(rng, 2, 7, 4, 16)
    r = client.attend(q, k, v, return_lse=True, backend="cpu")
    o, lse = oracle(q, k, v)
    assert r.o.dtype == np.float32 and r.o.shape == q.shape
    np.testing.assert_allclose(r.o, o, atol=2e-5, rtol=1e-5)
    assert r.lse.dtype == np.float32 and r.lse.shape == (2, 4, 5)
    np.testing.assert_allclose(r.lse, lse, atol=2e-5, rtol=1e-5)
    assert r.report.backend == "cpu" and r.report.times_us["total"] >= 0
    assert r.report.flops == 4 * 2 * 5 * 7 * 4 * 16


@pytest.mark.parametrize("causal", ["top_left", "bottom_right"])
@pytest.mark.parametrize("T,S", [(3, 8), (8, 3), (6, 6)])
def test_causal_alignment_t_ne_s(client, causal, T, S):
    rng = np.random.default_rng(T * 10 + S)
    q, k, v = rand(rng, 2, T, 2, 8), rand(rng, 2, S, 2, 8), rand(rng, 2, S, 2, 8)
    r = client.attend(q, k, v, causal=causal, return_lse=True)
    o, lse = oracle(q, k, v, causal=causal)
    np.testing.assert_allclose(r.o, o, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(r.lse, lse, atol=2e-5, rtol=1e-5)  # -inf rows match too


def test_top_left_and_bottom_right_differ_when_t_ne_s(client):
    rng = np.random.default_rng(1)
    q, k, v = rand(rng, 1, 2, 1, 8), rand(rng, 1, 5, 1, 8), rand(rng, 1, 5, 1, 8)
    a = client.attend(q, k, v, causal="top_left").o
    b = client.attend(q, k, v, causal="bottom_right").o
    assert not np.allclose(a, b)
    # bottom-right last row sees every key = no mask
    np.testing.assert_allclose(b[:, -1], client.attend(q, k, v).o[:, -1], atol=1e-6)


def test_sliding_window_and_scale(client):
    rng = np.random.default_rng(2)
    q, k, v = rand(rng, 1, 9, 2, 8), rand(rng, 1, 9, 2, 8), rand(rng, 1, 9, 2, 8)
    r = client.attend(q, k, v, causal="bottom_right", window=(3, None), scale=0.2)
    np.testing.assert_allclose(r.o, oracle(q, k, v, "bottom_right", (3, None), scale=0.2)[0],
                               atol=2e-5, rtol=1e-5)
    r = client.attend(q, k, v, window=(2, 1))
    np.testing.assert_allclose(r.o, oracle(q, k, v, None, (2, 1))[0], atol=2e-5, rtol=1e-5)


def test_gqa_and_mqa(client):
    rng = np.random.default_rng(3)
    for K in (2, 1):
        q, k, v = rand(rng, 2, 4, 8, 16), rand(rng, 2, 6, K, 16), rand(rng, 2, 6, K, 16)
        r = client.attend(q, k, v, causal="bottom_right")
        np.testing.assert_allclose(r.o, oracle(q, k, v, "bottom_right")[0], atol=2e-5,
                                   rtol=1e-5)


def test_padded_lengths_zero_padding_rows_and_empty_entry(client):
    rng = np.random.default_rng(4)
    q, k, v = rand(rng, 3, 6, 2, 8), rand(rng, 3, 7, 2, 8), rand(rng, 3, 7, 2, 8)
    ql, kl = [6, 2, 4], [7, 3, 0]
    k[1, 3:] = 1e30  # padding is never read
    r = client.attend(q, k, v, q_lengths=ql, kv_lengths=kl, causal="bottom_right",
                      return_lse=True)
    o, lse = oracle(q, k, v, "bottom_right", q_lengths=ql, kv_lengths=kl)
    np.testing.assert_allclose(r.o, o, atol=2e-5, rtol=1e-5)
    assert np.all(r.o[1, 2:] == 0) and np.all(r.o[2] == 0)
    assert np.all(np.isneginf(r.lse[2]))
    np.testing.assert_allclose(r.lse, lse, atol=2e-5, rtol=1e-5)


def test_varlen_matches_padded(client):
    rng = np.random.default_rng(5)
    ql, kl = [3, 1, 5], [4, 6, 5]
    q, k, v = rand(rng, 3, 5, 4, 8), rand(rng, 3, 6, 2, 8), rand(rng, 3, 6, 2, 8)
    r = client.attend(pack(q, ql), pack(k, kl), pack(v, kl), q_lengths=ql, kv_lengths=kl,
                      causal="bottom_right", return_lse=True)
    assert r.o.shape == (sum(ql), 4, 8) and r.lse.shape == (4, sum(ql))
    o, lse = oracle(q, k, v, "bottom_right", q_lengths=ql, kv_lengths=kl)
    np.testing.assert_allclose(r.o, pack(o, ql), atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(r.lse, np.concatenate([lse[b, :, :n] for b, n in enumerate(ql)],
                                                     axis=1), atol=2e-5, rtol=1e-5)


def test_dtypes_round_trip(client):
    rng = np.random.default_rng(6)
    q, k, v = rand(rng, 1, 4, 2, 32), rand(rng, 1, 5, 2, 32), rand(rng, 1, 5, 2, 32)
    # float16: result is float16, close to the oracle on the fp16-rounded inputs
    r = client.attend(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16))
    assert r.o.dtype == np.float16
    ref = oracle(*(x.astype(np.float16) for x in (q, k, v)))[0]
    np.testing.assert_allclose(r.o.astype(np.float64), ref, atol=2e-3, rtol=2e-3)
    # bfloat16 from float32 (bit-op rounding): float32 array of bf16 values unless ml_dtypes
    r = client.attend(q, k, v, dtype="bfloat16")
    ref = oracle(*(ac.round_to_bf16(x) for x in (q, k, v)))[0]
    out = np.asarray(r.o, dtype=np.float32)
    assert r.o.dtype.name in ("float32", "bfloat16")
    np.testing.assert_array_equal(ac.round_to_bf16(out), out)  # values are bf16-representable
    np.testing.assert_allclose(out, ref, atol=2e-2, rtol=2e-2)
    # float64 is sent as float32
    r = client.attend(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    assert r.o.dtype == np.float32
    np.testing.assert_allclose(r.o, oracle(q, k, v)[0], atol=2e-5, rtol=1e-5)


def test_bf16_bit_ops():
    x = np.array([1.0, -2.5, 1.00390625, 1.01171875, 3.0e38, np.inf, -np.inf, 0.0, np.nan,
                  1e-40], np.float32)
    bits = ac.float32_to_bf16_bits(x)
    y = ac.bf16_bits_to_float32(bits)
    assert y[0] == 1.0 and y[1] == -2.5
    assert y[2] == 1.0            # tie → even (1.00390625 is halfway between 1 and 1+2^-7)
    assert y[3] == 1.015625       # tie → even, rounds up to the even mantissa
    assert np.isinf(y[5]) and np.isinf(y[6]) and np.isnan(y[8]) and y[7] == 0.0
    try:
        import ml_dtypes
        ref = x.astype(ml_dtypes.bfloat16).astype(np.float32)
        np.testing.assert_array_equal(np.nan_to_num(y), np.nan_to_num(ref))
    except ImportError:
        pass


def test_errors_are_typed_and_keep_the_message(client):
    rng = np.random.default_rng(7)
    q, k = rand(rng, 1, 4, 3, 8), rand(rng, 1, 4, 2, 8)
    with pytest.raises(ac.InvalidArgument) as e:  # N % K != 0
        client.attend(q, k, k)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and e.value.method == "Attend"
    assert e.value.details and isinstance(e.value, ValueError)
    q, k = rand(rng, 1, 4, 2, 8), rand(rng, 1, 4, 2, 8)
    with pytest.raises(ac.InvalidArgument, match="no-such-backend|backend"):
        client.attend(q, k, k, backend="no-such-backend")
    with pytest.raises(ac.InvalidArgument, match="kv_lengths"):
        client.attend(q, k, k, kv_lengths=[9])
    with pytest.raises(ac.InvalidArgument):  # client-side: int dtype
        client.attend(q.astype(np.int32), k, k)
    with pytest.raises(ac.ResourceExhausted) as e:  # > --max-message-bytes 1000000
        big = rand(rng, 1, 256, 8, 64)
        client.attend(big, big, big)
    # gRPC refuses it before the service runs, with its own text (README "Status codes").
    assert "Received message larger than max" in e.value.details, e.value.details
    info = {b.name: b for b in client.server_info().backends}
    gpu = [n for n, b in info.items() if n != "cpu" and n != "auto" and not b.available]
    if gpu:  # a named backend that cannot run: FAILED_PRECONDITION
        with pytest.raises(ac.FailedPrecondition):
            client.attend(q, k, k, backend=gpu[0])
    with pytest.raises(ac.DeadlineExceeded):  # 0.1 ms: expires before or while it runs
        med = rand(rng, 1, 256, 4, 64)
        client.attend(med, med, med, timeout=1e-4)


def test_unavailable():
    with AttentionClient("127.0.0.1:1", timeout=2) as c:
        with pytest.raises(ac.Unavailable):
            c.server_info()


# ---- sequences ------------------------------------------------------------------------------

def test_sequence_lifecycle_equals_attend_over_history(client):
    rng = np.random.default_rng(8)
    L, N, K, H = 2, 4, 2, 16
    hist_k = {l: np.zeros((0, K, H), np.float32) for l in range(L)}
    hist_v = {l: np.zeros((0, K, H), np.float32) for l in range(L)}
    with client.create_sequence(L, N, K, H, dtype="float32") as seq:
        assert len(seq.id) == 32 and seq.layer_lengths == [0, 0]
        for T in (5, 1, 1, 3):  # prefill then decode steps
            for l in range(L):
                q, k, v = rand(rng, T, N, H), rand(rng, T, K, H), rand(rng, T, K, H)
                pos = seq.layer_lengths[l]
                r = seq.extend(l, pos, q, k, v)
                hist_k[l] = np.concatenate([hist_k[l], k])
                hist_v[l] = np.concatenate([hist_v[l], v])
                assert r.length == pos + T and not r.replayed
                ref = oracle(q[None], hist_k[l][None], hist_v[l][None], "bottom_right")[0][0]
                np.testing.assert_allclose(r.o, ref, atol=2e-5, rtol=1e-5)
                # the same through stateless Attend
                a = client.attend(q[None], hist_k[l][None], hist_v[l][None],
                                  causal="bottom_right").o[0]
                np.testing.assert_allclose(r.o, a, atol=1e-5, rtol=1e-5)
        assert seq.refresh().layer_lengths == [10, 10]
        # replay of the last step returns the stored result
        r2 = seq.extend(L - 1, 7, q, k, v)
        assert r2.replayed and r2.length == 10
        # wrong position → FailedPrecondition with the actual length
        with pytest.raises(ac.FailedPrecondition, match="10"):
            seq.extend(0, 3, q[:1], k[:1], v[:1])
        # fork at 6, extend child; parent unchanged
        child = seq.fork(6)
        assert child.id != seq.id and child.layer_lengths == [6, 6]
        q1, k1, v1 = rand(rng, 1, N, H), rand(rng, 1, K, H), rand(rng, 1, K, H)
        rc = child.extend(0, None, q1, k1, v1)
        ref = oracle(q1[None], np.concatenate([hist_k[0][:6], k1])[None],
                     np.concatenate([hist_v[0][:6], v1])[None], "bottom_right")[0][0]
        np.testing.assert_allclose(rc.o, ref, atol=2e-5, rtol=1e-5)
        assert seq.refresh().layer_lengths == [10, 10]
        child.release()
        with pytest.raises(ac.NotFound):
            child.refresh()
        # truncate then extend again at the cut
        assert list(seq.truncate(4).layer_lengths) == [4, 4]
        r3 = seq.extend(0, 4, q1, k1, v1)
        ref = oracle(q1[None], np.concatenate([hist_k[0][:4], k1])[None],
                     np.concatenate([hist_v[0][:4], v1])[None], "bottom_right")[0][0]
        np.testing.assert_allclose(r3.o, ref, atol=2e-5, rtol=1e-5)
        sid = seq.id
    with pytest.raises(ac.NotFound):  # released on exit
        client.sequence(sid)


def test_sequence_identity_and_batch(target, client):
    rng = np.random.default_rng(9)
    with AttentionClient(target, identity="alice") as alice, \
            AttentionClient(target, identity="bob") as bob:
        s1 = alice.create_sequence(1, 2, 1, 8, dtype="float16")
        s2 = alice.create_sequence(1, 2, 1, 8, dtype="float16")
        with pytest.raises(ac.NotFound):
            bob.sequence(s1.id)
        q, k, v = rand(rng, 2, 2, 8), rand(rng, 2, 1, 8), rand(rng, 2, 1, 8)
        res = alice.extend_batch([(s1, 0, 0, q, k, v), (s2, 0, 5, q, k, v)])
        assert isinstance(res[0], ac.ExtendResult) and res[0].o.dtype == np.float16
        ref = oracle(*(x[None].astype(np.float16) for x in (q, k, v)), "bottom_right")[0][0]
        np.testing.assert_allclose(res[0].o.astype(np.float64), ref, atol=2e-3, rtol=2e-3)
        assert isinstance(res[1], ac.FailedPrecondition)
        assert s1.layer_lengths == [2]
        s1.release()
        s2.release()
    with pytest.raises(ac.InvalidArgument):
        client.create_sequence(1, 3, 2, 8)  # N % K != 0


# ---- torch ----------------------------------------------------------------------------------

def test_torch_inputs(client):
    torch = pytest.importorskip("torch", reason="torch is not installed: torch input not "
                                "tested (numpy paths are)")
    rng = np.random.default_rng(10)
    q, k, v = rand(rng, 2, 3, 4, 16), rand(rng, 2, 5, 2, 16), rand(rng, 2, 5, 2, 16)
    r = client.attend(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                      causal="bottom_right")
    assert isinstance(r.o, torch.Tensor) and r.o.dtype == torch.float32
    np.testing.assert_allclose(r.o.numpy(), oracle(q, k, v, "bottom_right")[0], atol=2e-5,
                               rtol=1e-5)
    tq, tk, tv = (torch.from_numpy(x).to(torch.bfloat16) for x in (q, k, v))
    r = client.attend(tq, tk, tv)
    assert r.o.dtype == torch.bfloat16
    ref = oracle(*(t.float().numpy() for t in (tq, tk, tv)))[0]
    np.testing.assert_allclose(r.o.float().numpy(), ref, atol=2e-2, rtol=2e-2)


def test_client_side_errors_carry_their_status_code(client):
    """A check the client makes before sending raises the typed error with its gRPC code (the
    errors module's promise), method None; a server's error keeps the server's code."""
    from attention_client import errors
    with pytest.raises(errors.InvalidArgument) as e:
        client.build_request(np.zeros((1, 2, 2, 8), np.int32), np.zeros((1, 2, 2, 8), np.int32),
                             np.zeros((1, 2, 2, 8), np.int32))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and e.value.method is None
    assert str(e.value).startswith("INVALID_ARGUMENT: ")
    assert errors.Internal("x").code == grpc.StatusCode.INTERNAL
    assert errors.NotFound("x", grpc.StatusCode.NOT_FOUND, "Extend").method == "Extend"


@pytest.mark.parametrize("shapes, varlen, blamed, cleared", [
    # A rank-3 q with padded k and v: q is named (it was k, "must be rank 3 ... varlen").
    (((6, 4, 8), (1, 5, 2, 8), (1, 5, 2, 8)), None, ["q must be rank 4 (B,T,N,H), got shape "
                                                     "(6, 4, 8)"], ["k must", "v must"]),
    # A padded q with packed k and v: q again, in the varlen layout the other two have.
    (((1, 6, 4, 8), (6, 2, 8), (6, 2, 8)), None, ["q must be rank 3 (total_q,N,H)"],
     ["k must", "v must"]),
    # Only v off: v is named with k's layout.
    (((1, 6, 4, 8), (1, 5, 2, 8), (5, 2, 8)), None, ["v must be rank 4 (B,S,K,H), got shape "
                                                     "(5, 2, 8)"], ["q must", "k must"]),
    # varlen given: every argument of the other rank is named.
    (((1, 6, 4, 8), (1, 5, 2, 8), (1, 5, 2, 8)), True, ["q must be rank 3", "k must be rank 3",
                                                        "v must be rank 3"], []),
])
def test_rank_errors_name_the_wrong_argument_and_the_layout(shapes, varlen, blamed, cleared):
    """Client-side (before any call): the argument whose rank is wrong is the one named, with
    its shape and the expected layout; the arguments that fit are not blamed."""
    with AttentionClient("127.0.0.1:1") as c:
        arrays = [np.zeros(s, np.float32) for s in shapes]
        with pytest.raises(ac.InvalidArgument) as e:
            c.build_request(*arrays, varlen=varlen)
    msg = str(e.value)
    for needle in blamed:
        assert needle in msg, msg
    for needle in cleared:
        assert needle not in msg, msg
    assert "q (B,T,N,H), k and v (B,S,K,H)" in msg and e.value.method is None, msg


def test_empty_tensor_error_names_the_argument():
    with AttentionClient("127.0.0.1:1") as c:
        q, k = np.zeros((1, 3, 2, 8), np.float32), np.zeros((1, 0, 2, 8), np.float32)
        with pytest.raises(ac.InvalidArgument, match=r"k: empty tensor of shape \(1, 0, 2, 8\)"):
            c.build_request(q, k, np.zeros((1, 3, 2, 8), np.float32))
