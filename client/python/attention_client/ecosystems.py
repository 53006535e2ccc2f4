"""Entry points in other libraries' layouts and semantics, mapped exactly onto Attend.

    from attention_client import AttentionClient, torch_sdpa, jax_dot_product_attention
    o = torch_sdpa(client, q, k, v, is_causal=True)                 # (B, N, T, H), like torch
    o = jax_dot_product_attention(client, q, k, v, is_causal=True)  # (B, T, N, H), like JAX

The server's own layout is JAX's (B, T, N, H). Its windows sit on the top-left diagonal (j = i)
with CAUSAL_TOP_LEFT and on the bottom-right one (j = i + S_b - T_b) otherwise (attention.proto,
Mask); PyTorch's and JAX's causal masks and JAX's local_window_size are top-left. Both functions
translate to the server's terms exactly, and refuse (InvalidArgument, before any call) what the
server cannot compute exactly: they never drop an argument. Neither is differentiable.
"""
import numpy as np

from ._pb import attention_pb2 as pb
from .errors import InvalidArgument

_TORCH_HINT = ("if these are PyTorch SDPA's (B, N, T, H) arrays, transpose(1, 2) them or call "
               "attention_client.torch_sdpa")


def layout_hint(err, req):
    """The server's head-count error for an AttendRequest, with a layout hint when it fits.

    err: the InvalidArgument Attend raised; req: the AttendRequest sent. When the request is
    padded, the server refused its head counts (N % K != 0, "divisible by num_kv_heads", or
    N above the server's limit, "(num_heads): expected <=", as a long PyTorch sequence read as
    heads is) and the shapes would fit PyTorch's (B, N, T, H) (q.shape[1] % k.shape[1] == 0: the
    head and sequence axes may be swapped), returns a new InvalidArgument (same code and method)
    whose message adds that the expected layout is (B, T, N, H) and names torch_sdpa. Otherwise
    returns err itself. It never reinterprets the arrays: shapes that fit both layouts run as
    (B, T, N, H)."""
    qs, ks = list(req.q.shape), list(req.k.shape)
    details = err.details or ""
    head_error = "divisible by num_kv_heads" in details or "(num_heads): expected <=" in details
    if (req.layout != pb.LAYOUT_PADDED or len(qs) != 4 or len(ks) != 4 or ks[1] <= 0
            or qs[1] % ks[1] != 0 or not head_error):
        return err
    return InvalidArgument(
        f"{err.details}. The expected layout is (B, T, N, H) for q and (B, S, K, H) for k and "
        f"v; q {tuple(qs)} and k {tuple(ks)} also fit (B, N, T, H): {_TORCH_HINT}",
        err.code, err.method)


def _refuse(what):
    raise InvalidArgument(what)


def torch_sdpa(client, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False, **kw):
    """torch.nn.functional.scaled_dot_product_attention on the server.

    q (B, N, T, H), k and v (B, K, S, H): torch tensors in PyTorch's layout (heads before the
    sequence). is_causal: top-left causal (keep key j <= query i, as torch), CAUSAL_TOP_LEFT on
    the wire. scale: softmax scale (None: 1/sqrt(H)). enable_gqa: as torch, K < N (N % K == 0)
    only with enable_gqa=True; query head h reads key head h // (N // K).
    kw: passed to AttentionClient.attend (backend, timeout, dtype).
    Returns o (B, N, T, H), a contiguous torch tensor of q's dtype on q's device.
    Refused with InvalidArgument: attn_mask not None, dropout_p != 0, shapes that torch would
    also reject (rank other than 4, B/H/S mismatch, v's shape not k's, K != N without
    enable_gqa, N % K != 0), kw causal/window/varlen/q_lengths/kv_lengths/return_lse, and
    inputs needing autograd (the server's result carries no gradient).
    """
    import torch
    if attn_mask is not None:
        _refuse("torch_sdpa: attn_mask is not supported (the server takes causal/band masks "
                "only; use is_causal=True for the causal mask)")
    if dropout_p != 0.0:
        _refuse(f"torch_sdpa: dropout_p={dropout_p!r} is not supported (the server computes "
                "attention without dropout; pass 0.0)")
    bad = sorted(set(kw) & {"causal", "window", "varlen", "q_lengths", "kv_lengths",
                            "return_lse"})
    if bad:
        _refuse(f"torch_sdpa: {', '.join(bad)} not accepted here (torch's arguments only; use "
                "AttentionClient.attend for the server's own)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if type(t).__module__.split(".")[0] != "torch":
            _refuse(f"torch_sdpa: {name} must be a torch tensor, got {type(t).__name__}")
        if t.dim() != 4:
            _refuse(f"torch_sdpa: {name} must be rank 4 (B, heads, len, H); got shape "
                    f"{tuple(t.shape)}")
        if t.requires_grad and torch.is_grad_enabled():
            _refuse(f"torch_sdpa: {name} requires grad, but the server's result has no "
                    "gradient; call under torch.no_grad() or detach()")
    (b, n, t_len, h), (kb, kh, s, kd) = tuple(q.shape), tuple(k.shape)
    if tuple(v.shape) != tuple(k.shape):
        _refuse(f"torch_sdpa: v must have k's shape (B, K, S, H) {tuple(k.shape)}; got "
                f"{tuple(v.shape)}")
    if kb != b or kd != h:
        _refuse(f"torch_sdpa: q (B, N, T, H) {tuple(q.shape)} and k (B, K, S, H) "
                f"{tuple(k.shape)} must agree in B and H")
    if kh != n and not enable_gqa:
        _refuse(f"torch_sdpa: q has {n} heads and k {kh}: grouped-query attention needs "
                "enable_gqa=True (as in torch)")
    if n % kh != 0:
        _refuse(f"torch_sdpa: q's {n} heads must be a multiple of k's {kh}")
    r = client.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                      causal="top_left" if is_causal else None, scale=scale, varlen=False,
                      **kw)
    return r.o.transpose(1, 2).contiguous()


def _is_jax(x):
    return type(x).__module__.split(".")[0] in ("jax", "jaxlib")


def _window(local_window_size):
    if local_window_size is None:
        return None
    if isinstance(local_window_size, (int, np.integer)):
        local_window_size = (local_window_size, local_window_size)
    left, right = (int(x) for x in local_window_size)
    if left < 0 or right < 0:
        _refuse(f"jax_dot_product_attention: local_window_size {local_window_size} must be "
                ">= 0 on both sides")
    return left, right


def _lengths_or(lengths, b, full):
    if lengths is None:
        return np.full(b, full, dtype=np.int64)
    out = np.asarray(lengths).astype(np.int64).reshape(-1)
    if out.shape[0] != b:
        _refuse(f"jax_dot_product_attention: sequence lengths need {b} entries (B); got "
                f"{out.shape[0]}")
    return out


def _server_mask(is_causal, window, tq, sk):
    """(causal, window) for Attend giving JAX's top-left mask; tq, sk: per-entry lengths."""
    if window is None:
        return ("top_left" if is_causal else None), None
    left, right = window
    if is_causal or right == 0:  # keep i - left <= j <= i: the top-left band, exactly
        return "top_left", (left, None)
    # No causal alignment: the server's band is centred on j = i + (S_b - T_b).
    delta = set(int(x) for x in (sk - tq))
    if len(delta) != 1:
        _refuse("jax_dot_product_attention: local_window_size without is_causal needs the same "
                "S_b - T_b in every entry (the server's window is centred on the bottom-right "
                f"diagonal there); got S_b - T_b = {sorted(delta)}")
    d = delta.pop()
    sl, sr = left + d, right - d
    if sl < 0 or sr < 0:
        _refuse(f"jax_dot_product_attention: local_window_size {window} with S - T = {d} and "
                "no is_causal cannot be expressed on the server (its window is centred on the "
                "bottom-right diagonal j = i + S - T; the shifted window would be "
                f"({sl}, {sr}))")
    return None, (sl, sr)


def _check_rows_see_keys(is_causal, window, tq, sk):
    """JAX gives a row that sees no key the mean of all values; the server gives zeros."""
    left = window[0] if window else None
    right = 0 if is_causal else (window[1] if window else None)
    for b, (t, s) in enumerate(zip(tq, sk)):
        if t <= 0:
            continue
        last = t - 1  # the row with the fewest keys: the band moves right with i
        lo = 0 if left is None else max(0, last - left)
        hi = s - 1 if right is None else min(s - 1, last + right)
        if lo > hi:
            _refuse(f"jax_dot_product_attention: in entry {b}, query row {last} sees no key "
                    "(JAX returns the mean of all values there, the server zeros): refused")


def jax_dot_product_attention(client, query, key, value, bias=None, mask=None, *, scale=None,
                              is_causal=False, query_seq_lengths=None,
                              key_value_seq_lengths=None, local_window_size=None,
                              implementation=None, **kw):
    """jax.nn.dot_product_attention on the server, with JAX's arguments and semantics.

    query (B, T, N, H) or (T, N, H); key and value (B, S, K, H) or (S, K, H), N % K == 0 (GQA).
    JAX arrays or numpy arrays (float32, float16, bfloat16). is_causal: top-left (keep j <= i).
    query_seq_lengths / key_value_seq_lengths: (B) valid lengths (rows past a query length are
    zeros, as in JAX). local_window_size: int w (= (w, w)) or (left, right), keep
    i - left <= j <= i + right, the top-left diagonal as in JAX; mapped onto the server's
    bottom-right-centred window when is_causal is False and right > 0 (shifted by S_b - T_b).
    kw: passed to AttentionClient.attend (backend, timeout, dtype).
    Returns o of query's shape: a jax array of query's dtype for a jax query, else numpy.
    Refused with InvalidArgument: bias, mask, implementation not None (it picks a JAX kernel;
    use kw backend= for the server's), a window needing a shift that is not the same in every
    entry or that would go negative, and any valid query row that would see no key (JAX gives
    it the mean of all values; the server gives zeros).
    """
    if bias is not None:
        _refuse("jax_dot_product_attention: bias is not supported (the server adds no bias)")
    if mask is not None:
        _refuse("jax_dot_product_attention: mask is not supported (the server takes causal and "
                "local_window_size masks only)")
    if implementation is not None:
        _refuse(f"jax_dot_product_attention: implementation={implementation!r} selects a JAX "
                "kernel; the server chooses its own backend (pass backend=...)")
    bad = sorted(set(kw) & {"causal", "window", "varlen", "q_lengths", "kv_lengths",
                            "return_lse"})
    if bad:
        _refuse(f"jax_dot_product_attention: {', '.join(bad)} not accepted here (JAX's "
                "arguments only; use AttentionClient.attend for the server's own)")
    q, k, v = (np.asarray(x) for x in (query, key, value))
    unbatched = q.ndim == 3
    if unbatched:
        q, k, v = q[None], k[None], v[None]
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        _refuse("jax_dot_product_attention: query (B, T, N, H) or (T, N, H), key and value "
                f"of the same rank; got {np.shape(query)}, {np.shape(key)}, {np.shape(value)}")
    b, t, s = q.shape[0], q.shape[1], k.shape[1]
    window = _window(local_window_size)
    tq = _lengths_or(query_seq_lengths, b, t)
    sk = _lengths_or(key_value_seq_lengths, b, s)
    causal, server_window = _server_mask(is_causal, window, tq, sk)
    _check_rows_see_keys(is_causal, window, tq, sk)
    r = client.attend(q, k, v, causal=causal, window=server_window, scale=scale, varlen=False,
                      q_lengths=None if query_seq_lengths is None else tq,
                      kv_lengths=None if key_value_seq_lengths is None else sk, **kw)
    o = r.o[0] if unbatched else r.o
    if _is_jax(query):
        import jax.numpy as jnp
        return jnp.asarray(o, dtype=query.dtype)
    return o
