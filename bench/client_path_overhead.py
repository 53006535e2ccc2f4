#!/usr/bin/env python3
"""Python client per-call costs against a running server (CPU or GPU; say which when quoting):
GetLoad (empty call) latency per target, and ExtendBatch of B decode steps (N32 K8 H64 bf16,
numpy input) through the old path (float32 arrays converted to bf16) and the fast path (uint16
bf16 bits taken as they are). Context held at --ctx tokens (a TruncateSequence after each timed
call, untimed). Besides the whole call it times the client's own request build ("encode") and
result decode on the same steps, without an RPC.

Usage: python3 bench/client_path_overhead.py --target 127.0.0.1:50051 --target unix:/tmp/a.sock
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "client", "python"))
import attention_client as ac  # noqa: E402
from attention_client._pb import sequence_pb2 as spb  # noqa: E402

N, K, H = 32, 8, 64


def pct(xs):
    xs = np.asarray(xs) * 1e6
    return f"p50 {np.percentile(xs, 50):8.1f} us p99 {np.percentile(xs, 99):8.1f} us"


def getload(c, n):
    for _ in range(200):
        c.load()
    xs = []
    for _ in range(n):
        a = time.perf_counter()
        c.load()
        xs.append(time.perf_counter() - a)
    return xs


def extend(c, B, ctx, iters, rng):
    seqs = [c.create_sequence(1, N, K, H, dtype="bfloat16", reserve_tokens=ctx + 4)
            for _ in range(B)]
    pre = [ac.float32_to_bf16_bits(rng.standard_normal((ctx, n, H)).astype(np.float32))
           for n in (N, K, K)]
    c.extend_batch([(s, 0, None, *pre) for s in seqs])
    f32 = [ac.round_to_bf16(rng.standard_normal((1, n, H)).astype(np.float32)) for n in (N, K, K)]
    bits = [ac.float32_to_bf16_bits(x) for x in f32]
    resp = spb.ExtendBatchResponse()  # a response like the server's, for the decode timing
    for _ in seqs:
        r = resp.results.add()
        r.response.o.dtype = 3
        r.response.o.shape.extend([1, N, H])
        r.response.o.data = bits[0].tobytes()
        r.response.length = ctx + 1
    out = {}
    for path, arrs, fast in (("old", f32, False), ("fast", bits, True)):
        steps = [(s, 0, ctx, *arrs) for s in seqs]
        call, enc, dec = [], [], []
        for _ in range(iters):
            a = time.perf_counter()
            r = c.extend_batch(steps, fast=fast)
            call.append(time.perf_counter() - a)
            assert not isinstance(r[0], Exception), r[0]
            for s in seqs:
                s.truncate(ctx)
            a = time.perf_counter()
            p = c._plan(steps, fast)
            c._batch_request(steps, p)
            enc.append(time.perf_counter() - a)
            a = time.perf_counter()
            c._batch_results(steps, resp, p)
            dec.append(time.perf_counter() - a)
        out[path] = (call, enc, dec)
    for s in seqs:
        s.release()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", action="append", required=True)
    ap.add_argument("--getload-calls", type=int, default=2000)
    ap.add_argument("--ctx", type=int, default=32)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--batch", type=int, action="append")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    for t in a.target:
        with ac.AttentionClient(t, timeout=60) as c:
            print(f"{t}: GetLoad x{a.getload_calls}: {pct(getload(c, a.getload_calls))}")
            for B in a.batch or [1, 32]:
                for path, (call, enc, dec) in extend(c, B, a.ctx, a.iters, rng).items():
                    print(f"{t}: ExtendBatch B={B:2d} {path:4s}: call {pct(call)} | "
                          f"encode {pct(enc)} | decode {pct(dec)}")


if __name__ == "__main__":
    main()
