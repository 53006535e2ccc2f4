"""Client-side cost of one ExtendBatch without a server: the protobuf fast path vs the wire path.

Cases (bf16, N=32 K=8 H=64, 32 sequences): "prefill" (512 tokens each: ~100 MB up, 64 MiB
down) and "decode" (1 token each). For each, with numpy uint16 (raw bf16 bits) inputs:
  encode  protobuf: fastpath.tensor_bytes + filling ExtendBatchRequest + SerializeToString()
                    (what grpcio then does with the message);
          wire:     fastpath.tensor_views + wire.encode_batch (the bytes grpcio is handed);
  decode  protobuf: ExtendBatchResponse.FromString (grpcio's deserializer) + the client's
                    _batch_results (reads every o.data, scatters into one buffer);
          wire:     the client's _batch_results on the reply bytes (wire.decode_batch + one
                    copy of each o into the output buffer; replies under
                    wire.WALK_MIN_BYTES per result parsed whole by protobuf, as the client
                    does; "walked" forces the walk for every size).
The reply is built once (protobuf) with every step OK and the server's report filled.
Prints ms p50 (and p90) over --repeats per cell; --json PATH also writes them.
Run: PYTHONPATH=client/python python3 bench/client_wire_bench.py [--repeats 15]
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "client", "python"))
from attention_client import AttentionClient, wire  # noqa: E402
from attention_client._pb import attention_pb2 as pb  # noqa: E402
from attention_client._pb import sequence_pb2 as spb  # noqa: E402
from attention_client.sequence import Sequence  # noqa: E402

B, N, K, H = 32, 32, 8, 64


def make_case(client, T, rng):
    """(steps, reply bytes) of one bf16 ExtendBatch of B sequences x T tokens."""
    steps = []
    for b in range(B):
        info = spb.SequenceInfo(sequence_id=f"{b:032x}", num_layers=1, dtype=pb.BFLOAT16,
                                layer_lengths=[0])
        q, k, v = (rng.integers(0, 1 << 16, size=(T, n, H), dtype=np.uint16)
                   for n in (N, K, K))
        steps.append((Sequence(client, info), 0, 0, q, k, v))
    resp = spb.ExtendBatchResponse()
    for b in range(B):
        r = resp.results.add()
        r.response.o.dtype = pb.BFLOAT16
        r.response.o.shape.extend([T, N, H])
        r.response.o.data = rng.integers(0, 1 << 16, size=(T, N, H), dtype=np.uint16).tobytes()
        r.response.length = T
        rep = r.response.report
        rep.backend, rep.backend_reason, rep.device = "cpu", "auto: fastest", "cpu"
        rep.batch_size, rep.batch_tokens, rep.flops = B, B * T, 4.0 * T * T * N * H
        rep.times.kernel_us, rep.times.total_us = 1234, 2345
    return steps, resp.SerializeToString()


def timed(fn, repeats):
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return {"p50_ms": statistics.median(out),
            "p90_ms": sorted(out)[min(len(out) - 1, int(0.9 * len(out)))]}


def bench_case(client, T, repeats, rng):
    steps, reply = make_case(client, T, rng)
    p = client._plan(steps, True)
    up = sum(s[i].nbytes for s in steps for i in (3, 4, 5))

    def encode(use_wire):
        client.wire = use_wire
        req = client._batch_request(steps, p)
        return req if use_wire else req.SerializeToString()

    assert encode(True) == encode(False)  # the same bytes go on the wire
    res = {"tensor_MB_up": up / 1e6, "reply_MB": len(reply) / 1e6}
    res["encode_protobuf"] = timed(lambda: encode(False), repeats)
    res["encode_wire"] = timed(lambda: encode(True), repeats)
    client.wire = True
    res["decode_protobuf"] = timed(lambda: client._batch_results(
        steps, spb.ExtendBatchResponse.FromString(reply), p), repeats)
    res["decode_wire"] = timed(lambda: client._batch_results(steps, reply, p), repeats)
    keep, wire.WALK_MIN_BYTES = wire.WALK_MIN_BYTES, 0  # every reply walked, however small
    try:
        res["decode_wire_walked"] = timed(lambda: client._batch_results(steps, reply, p),
                                          repeats)
    finally:
        wire.WALK_MIN_BYTES = keep
    a = client._batch_results(steps, reply, p)
    b = client._batch_results(steps, spb.ExtendBatchResponse.FromString(reply), p)
    assert all(np.array_equal(x.o, y.o) for x, y in zip(a, b))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=15, help="timed runs per cell (prefill)")
    ap.add_argument("--decode-repeats", type=int, default=200, help="timed runs per cell "
                    "(decode)")
    ap.add_argument("--json", help="also write the results to this file")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    doc = {"shape": {"B": B, "N": N, "K": K, "H": H, "dtype": "bfloat16"},
           "load_avg": os.getloadavg()}
    with AttentionClient("127.0.0.1:9") as client:  # never connects
        doc["prefill_T512"] = bench_case(client, 512, a.repeats, rng)
        doc["decode_T1"] = bench_case(client, 1, a.decode_repeats, rng)
    print(f"ExtendBatch bf16 B={B} N={N} K={K} H={H}; load avg "
          f"{', '.join(f'{x:.2f}' for x in doc['load_avg'])}")
    print(f"{'case':<14}{'MB up':>8}{'MB down':>9}  {'phase':<8}{'protobuf p50/p90 ms':>22}"
          f"{'wire p50/p90 ms':>18}{'speedup':>9}")
    for case in ("prefill_T512", "decode_T1"):
        r = doc[case]
        for ph in ("encode", "decode"):
            o, w = r[f"{ph}_protobuf"], r[f"{ph}_wire"]
            print(f"{case:<14}{r['tensor_MB_up']:>8.2f}{r['reply_MB']:>9.2f}  {ph:<8}"
                  f"{o['p50_ms']:>13.3f}/{o['p90_ms']:<8.3f}{w['p50_ms']:>9.3f}/"
                  f"{w['p90_ms']:<8.3f}{o['p50_ms'] / w['p50_ms']:>8.2f}x")
        k = r["decode_wire_walked"]
        print(f"{case:<14}{'':>17}  {'(walked: every reply through wire.decode_batch)':<48}"
              f"{k['p50_ms']:>7.3f}/{k['p90_ms']:.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
