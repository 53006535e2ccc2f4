"""A float64 numpy oracle for one attention problem, written independently of the server:
O = softmax(scale · Q Kᵀ + mask) V for q (T,N,H) and k, v (S,K,H), grouped heads (query head h
reads KV head h // (N/K)), causal alignment None / "top_left" / "bottom_right" (DESIGN.md §4).
A row that sees no key is zeros.
"""
import numpy as np


def attention(q, k, v, causal=None, scale=None):
    q = np.asarray(q, np.float64)
    k = np.asarray(k, np.float64)
    v = np.asarray(v, np.float64)
    t, n, h = q.shape
    s, kh, _ = k.shape
    scale = 1.0 / np.sqrt(h) if scale is None else scale
    group = n // kh
    out = np.zeros((t, n, h))
    i = np.arange(t)[:, None]
    j = np.arange(s)[None, :]
    if causal == "top_left":
        keep = j <= i
    elif causal == "bottom_right":
        keep = j <= i + (s - t)
    else:
        keep = np.ones((t, s), bool)
    for head in range(n):
        kv = head // group
        logits = scale * q[:, head, :] @ k[:, kv, :].T
        logits = np.where(keep, logits, -np.inf)
        m = logits.max(axis=1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        p = np.where(keep, np.exp(logits - m), 0.0)
        denom = p.sum(axis=1, keepdims=True)
        out[:, head, :] = np.where(denom > 0, (p @ v[:, kv, :]) / np.where(denom > 0, denom, 1),
                                   0.0)
    return out


def rel_error(got, want):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    denom = np.linalg.norm(want)
    return float(np.linalg.norm(got - want) / (denom if denom > 0 else 1.0))
