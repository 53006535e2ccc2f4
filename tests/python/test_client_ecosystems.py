"""attention_client.torch_sdpa and jax_dot_product_attention against the real server (cpu
backend), compared with torch.nn.functional.scaled_dot_product_attention, with
jax.nn.dot_product_attention, and with a float64 numpy reference of JAX's documented mask
(top-left causal, local_window_size (left, right) around j = i). The torch and JAX comparisons
skip when the library is not importable; the numpy ones always run. Also: the refusals, and the
layout hint of AttentionClient.attend for (B, N, T, H) arrays.

Run: ATTN_SERVER_BIN=build-cpu/server/attention-server PYTHONPATH=client/python \
     python3 -m pytest -q tests/python/test_client_ecosystems.py
"""
import asyncio
import os
import sys

import grpc
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import attention_client as ac  # noqa: E402
from attention_client import (AttentionClient, jax_dot_product_attention,  # noqa: E402
                              torch_sdpa)
from live_server import LiveServer  # noqa: E402


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    server = LiveServer("tcp", tmp_path_factory.mktemp("eco"))
    try:
        with AttentionClient(server.target, timeout=30) as c:
            yield c
    finally:
        server.stop()


def _ref(q, k, v, is_causal=False, window=None, q_len=None, kv_len=None, scale=None):
    """float64 JAX semantics: q (B,T,N,H), k/v (B,S,K,H); keep i-left <= j <= i+right, j <= i
    when causal, j < kv_len; rows past q_len are zeros."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    b, t, n, h = q.shape
    s, kh = k.shape[1], k.shape[2]
    k, v = np.repeat(k, n // kh, axis=2), np.repeat(v, n // kh, axis=2)
    logits = np.einsum("btnh,bsnh->bnts", q, k) * (scale or 1.0 / np.sqrt(h))
    i, j = np.arange(t)[:, None], np.arange(s)[None, :]
    keep = np.ones((b, 1, t, s), dtype=bool)
    if is_causal:
        keep &= j <= i
    if window is not None:
        keep &= (i - window[0] <= j) & (j <= i + window[1])
    if kv_len is not None:
        keep &= (j[None] < np.asarray(kv_len)[:, None, None])[:, None]
    logits = np.where(keep, logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    o = np.einsum("bnts,bsnh->btnh", p / p.sum(-1, keepdims=True), v)
    if q_len is not None:
        o *= (np.arange(t)[None, :] < np.asarray(q_len)[:, None])[:, :, None, None]
    return o


def _qkv(rng, b, t, s, n, kh, h):
    return (rng.standard_normal((b, t, n, h)).astype(np.float32),
            rng.standard_normal((b, s, kh, h)).astype(np.float32),
            rng.standard_normal((b, s, kh, h)).astype(np.float32))


# (name, (B, T, S, N, K, H), jax kwargs). Windows without is_causal and T != S are the case the
# server's bottom-right-centred window gets wrong unless shifted (issue 19: |Δ| 3.64).
JAX_CASES = [
    ("causal", (2, 6, 6, 4, 4, 8), dict(is_causal=True)),
    ("causal_t_ne_s", (2, 5, 9, 4, 4, 8), dict(is_causal=True)),
    ("gqa_t_ne_s", (2, 7, 4, 6, 2, 8), dict(is_causal=False)),
    ("gqa_causal", (1, 8, 8, 8, 2, 16), dict(is_causal=True, scale=0.3)),
    ("window_causal", (2, 9, 9, 4, 2, 8), dict(is_causal=True, local_window_size=(2, 0))),
    ("window_sym", (1, 8, 8, 2, 2, 8), dict(local_window_size=2)),
    ("window_t_lt_s", (2, 5, 9, 4, 4, 8), dict(local_window_size=(2, 6))),
    ("window_t_gt_s", (1, 9, 5, 2, 1, 8), dict(local_window_size=(4, 1))),
    ("window_right0_t_ne_s", (1, 6, 10, 2, 2, 8), dict(local_window_size=(3, 0))),
    ("window_causal_t_ne_s", (1, 7, 12, 4, 2, 8), dict(is_causal=True, local_window_size=(3, 2))),
    ("lengths", (2, 6, 8, 4, 2, 8),
     dict(is_causal=True, query_seq_lengths=np.array([4, 6], np.int32),
          key_value_seq_lengths=np.array([5, 8], np.int32))),
]


def _ref_kwargs(kw):
    w = kw.get("local_window_size")
    return dict(is_causal=kw.get("is_causal", False),
                window=(w, w) if isinstance(w, int) else w, scale=kw.get("scale"),
                q_len=kw.get("query_seq_lengths"), kv_len=kw.get("key_value_seq_lengths"))


@pytest.mark.parametrize("name,dims,kw", JAX_CASES, ids=[c[0] for c in JAX_CASES])
def test_jax_entry_matches_float64_reference(client, name, dims, kw):
    q, k, v = _qkv(np.random.default_rng(len(name)), *dims)
    o = jax_dot_product_attention(client, q, k, v, **kw)
    assert isinstance(o, np.ndarray) and o.shape == q.shape and o.dtype == np.float32
    np.testing.assert_allclose(o, _ref(q, k, v, **_ref_kwargs(kw)), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name,dims,kw", JAX_CASES, ids=[c[0] for c in JAX_CASES])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_jax_entry_matches_jax(client, name, dims, kw, dtype):
    jax = pytest.importorskip("jax", reason="jax is needed for the JAX comparison")
    jnp = jax.numpy
    q, k, v = (jnp.asarray(x, dtype=dtype) for x in _qkv(np.random.default_rng(7), *dims))
    kw = {a: (jnp.asarray(b) if isinstance(b, np.ndarray) else b) for a, b in kw.items()}
    want = jax.nn.dot_product_attention(q, k, v, **kw)
    got = jax_dot_product_attention(client, q, k, v, **kw)
    assert isinstance(got, jax.Array) and got.dtype == q.dtype and got.shape == want.shape
    tol = 2e-5 if dtype == "float32" else 3e-2
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               atol=tol, rtol=tol)


def test_jax_entry_unbatched(client):
    q, k, v = _qkv(np.random.default_rng(3), 1, 5, 7, 2, 1, 8)
    o = jax_dot_product_attention(client, q[0], k[0], v[0], is_causal=True)
    assert o.shape == q[0].shape
    np.testing.assert_allclose(o, _ref(q, k, v, is_causal=True)[0], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kw,needle", [
    (dict(bias=np.zeros((1, 2, 5, 9), np.float32)), "bias"),
    (dict(mask=np.ones((1, 2, 5, 9), bool)), "mask"),
    (dict(implementation="xla"), "implementation"),
    (dict(local_window_size=(2, 3)), "cannot be expressed"),     # S - T = 4 > right
    (dict(local_window_size=(-1, 2)), ">= 0"),
    (dict(is_causal=True, local_window_size=(0, 0),
          key_value_seq_lengths=np.array([0], np.int32)), "sees no key"),
    (dict(local_window_size=(1, 8), query_seq_lengths=np.array([5, 4]),
          key_value_seq_lengths=np.array([9, 9])), "same S_b - T_b"),
    (dict(window=(1, 1)), "not accepted"),
], ids=["bias", "mask", "implementation", "window_shift", "window_negative", "empty_row",
        "window_ragged", "server_kwarg"])
def test_jax_entry_refusals(client, kw, needle):
    b = 2 if "query_seq_lengths" in kw else 1
    q, k, v = _qkv(np.random.default_rng(1), b, 5, 9, 2, 2, 8)
    with pytest.raises(ac.InvalidArgument, match=needle):
        jax_dot_product_attention(client, q, k, v, **kw)


TORCH_CASES = [  # (name, (B, N, K, T, S, H), kwargs)
    ("plain", (2, 4, 4, 6, 6, 8), dict()),
    ("causal", (2, 4, 4, 7, 7, 16), dict(is_causal=True)),
    ("causal_t_lt_s", (1, 4, 4, 5, 11, 8), dict(is_causal=True)),
    ("causal_t_gt_s", (1, 2, 2, 9, 4, 8), dict(is_causal=True, scale=0.25)),
    ("gqa", (2, 8, 2, 6, 10, 8), dict(enable_gqa=True)),
    ("gqa_causal", (1, 6, 3, 8, 8, 8), dict(is_causal=True, enable_gqa=True)),
]


@pytest.mark.parametrize("name,dims,kw", TORCH_CASES, ids=[c[0] for c in TORCH_CASES])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_sdpa_matches_torch(client, name, dims, kw, dtype):
    torch = pytest.importorskip("torch", reason="torch is needed for the torch comparison")
    b, n, kh, t, s, h = dims
    g = torch.Generator().manual_seed(len(name))
    dt = getattr(torch, dtype)
    q = torch.randn(b, n, t, h, generator=g).to(dt)
    k = torch.randn(b, kh, s, h, generator=g).to(dt)
    v = torch.randn(b, kh, s, h, generator=g).to(dt)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)
    got = torch_sdpa(client, q, k, v, **kw)
    assert got.dtype == q.dtype and got.device == q.device and got.shape == want.shape
    assert got.is_contiguous()
    tol = 2e-5 if dtype == "float32" else 3e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("kw,needle", [
    (dict(attn_mask="band"), "attn_mask"),
    (dict(dropout_p=0.1), "dropout_p"),
    (dict(gqa=True), "enable_gqa=True"),
    (dict(causal="bottom_right"), "not accepted"),
    (dict(grad=True), "requires grad"),
], ids=["attn_mask", "dropout", "gqa_without_flag", "server_kwarg", "autograd"])
def test_torch_sdpa_refusals(client, kw, needle):
    torch = pytest.importorskip("torch", reason="torch is needed for torch_sdpa")
    q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, 4, 7, 8), torch.randn(1, 4, 7, 8)
    if kw.pop("gqa", False):
        k, v = k[:, :2], v[:, :2]
    if kw.pop("grad", False):
        q.requires_grad_(True)
    if kw.get("attn_mask") == "band":
        kw["attn_mask"] = torch.ones(5, 7, dtype=torch.bool).tril()
    with pytest.raises(ac.InvalidArgument, match=needle):
        torch_sdpa(client, q, k, v, **kw)


def test_attend_hints_at_torch_layout(client):
    """(B, N, T, H) arrays whose head counts cannot divide: the error names the layout."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 4, 5, 8)).astype(np.float32)   # torch (B, N=4, T=5, H)
    k = rng.standard_normal((1, 2, 3, 8)).astype(np.float32)   # torch (B, K=2, S=3, H)
    with pytest.raises(ac.InvalidArgument) as e:
        client.attend(q, k, k)
    assert "(B, T, N, H)" in str(e.value) and "torch_sdpa" in str(e.value)
    assert "divisible by num_kv_heads" in str(e.value)   # the server's own message is kept
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and e.value.method == "Attend"

    async def via_aio():
        async with ac.AsyncAttentionClient(client.target, timeout=30) as c:
            await c.attend(q, k, k)
    with pytest.raises(ac.InvalidArgument, match=r"\(B, T, N, H\).*torch_sdpa"):
        asyncio.run(via_aio())
    # The same counts in the right layout run, and a plain head-count error gets no hint.
    qt, kt = q.transpose(0, 2, 1, 3).copy(), k.transpose(0, 2, 1, 3).copy()
    o = client.attend(qt, kt, kt).o
    np.testing.assert_allclose(o, _ref(qt, kt, kt), atol=2e-5, rtol=1e-4)
    with pytest.raises(ac.InvalidArgument) as e:
        client.attend(qt[:, :, :3], kt, kt)   # 3 heads over 2: no (B, N, T, H) reading fits
    assert "torch_sdpa" not in str(e.value) and "divisible" in str(e.value)


def test_attend_hints_at_torch_layout_when_the_sequence_reads_as_too_many_heads(client):
    """A long PyTorch (B, N, T, H) sequence read as heads passes the divisibility check but
    exceeds the server's head limit (1024): that error names the layout and torch_sdpa too."""
    rng = np.random.default_rng(6)
    q = rng.standard_normal((1, 2, 1100, 8)).astype(np.float32)   # torch (B, N=2, T=1100, H)
    k = rng.standard_normal((1, 2, 1100, 8)).astype(np.float32)
    with pytest.raises(ac.InvalidArgument) as e:
        client.attend(q, k, k)
    msg = str(e.value)
    assert "(num_heads): expected <= " in msg   # the server's own message is kept
    assert "(B, T, N, H)" in msg and "torch_sdpa" in msg, msg
