#!/usr/bin/env python3
"""The Python client's own per-call cost on the packed decode path (extend_packed), next to the
empty-call floor (GetLoad) and the server's reported time, in one run.

For each input kind (numpy bf16 bits as uint16; torch CPU bf16 when torch is installed; torch
CUDA bf16 with --cuda, only where torch.cuda is available) and each batch B (default 1 and 32):
B sequences (N=32 query heads, K=8 kv heads, H=128, bf16, 1 layer) get a --ctx token prefill,
then --iters decode calls of extend_packed (each sequence one step of T=1) are timed. Every
--hold calls the sequences are truncated back to --ctx (untimed) so the context stays in
[ctx, ctx + hold). Per call: wall time, the client's phases (extend_packed(..., timings=):
gather_us, encode_us, rpc_us, decode_us, scatter_us) and the server's Report total_us.
"own" = wall - rpc_us (the client's work outside the gRPC call); "rpc - server" = what the
gRPC call costs beyond the server's own time (compare with the GetLoad floor). "bare": the
same calls' request bytes built beforehand (untimed) and sent through the channel's raw
ExtendBatch callable, timed alone: "wall - bare" (p50s) is all the client adds to a call.
"cpu": the calling thread's CPU time per call (time.thread_time_ns; unlike wall time it does
not count time the thread waits or is preempted, so it holds on a busy host): "own cpu" =
cpu p50 of extend_packed - cpu p50 of the bare call, the client's own work.

    python3 bench/python_client_overhead.py --server build-cpu/server/attention-server \
        --transport unix --json /tmp/overhead.json
    python3 bench/python_client_overhead.py --target 127.0.0.1:50051 --cuda   # GPU host

--offline needs no server: it times extend_packed's own work (request bytes built, a canned
reply read) in a warm loop, the floor of "own" above.
Writes JSON (--json) with every row of the table and the arguments; --profile KIND:B runs
cProfile over that configuration's timed calls and prints the top functions (by tottime).
"""
import argparse
import cProfile
import json
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

ac = None  # attention_client, imported in main() (from --client)
PHASES = ("gather_us", "encode_us", "rpc_us", "decode_us", "scatter_us")

N, K, H = 32, 8, 128


def start_server(binary, transport, tmp):
    """A CPU server on a Unix socket or 127.0.0.1:0 → (Popen, target)."""
    sock = os.path.join(tmp, "attn.sock")
    port_file = os.path.join(tmp, "port")
    listen = f"unix:{sock}" if transport == "unix" else "127.0.0.1:0"
    log = open(os.path.join(tmp, "server.log"), "w")
    proc = subprocess.Popen([binary, "--listen", listen, "--port-file", port_file,
                             "--metrics-address", "", "--default-backend", "cpu",
                             "--kv-device", "cpu"], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        if os.path.exists(port_file) and open(port_file).read().strip():
            text = open(port_file).read().strip()
            return proc, (text if transport == "unix" else f"127.0.0.1:{int(text)}")
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("server did not start")


def pct(xs, q):
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if len(xs) else 0.0


def floor(c, iters):
    """GetLoad (the empty call) → (wall µs, thread CPU µs) per call."""
    for _ in range(200):
        c.load()
    xs, cpu = [], []
    for _ in range(iters):
        c0, a = time.thread_time_ns(), time.perf_counter_ns()
        c.load()
        xs.append((time.perf_counter_ns() - a) / 1e3)
        cpu.append((time.thread_time_ns() - c0) / 1e3)
    return xs, cpu


def make_inputs(kind, rows, rng):
    """q (rows,N,H), k, v (rows,K,H) bf16 of the kind: numpy uint16 bits or torch bfloat16."""
    f32 = [rng.standard_normal((rows, n, H)).astype(np.float32) for n in (N, K, K)]
    bits = [ac.float32_to_bf16_bits(x) for x in f32]
    if kind == "numpy":
        return bits
    import torch
    dev = "cuda" if kind == "cuda" else "cpu"
    return [torch.from_numpy(x).to(torch.bfloat16).to(dev) for x in f32]


def run_config(c, kind, B, a, rng, profile=False):
    """Times a.iters decode calls of B sequences → dict of per-call lists (µs)."""
    seqs = [c.create_sequence(1, N, K, H, dtype="bfloat16", reserve_tokens=a.ctx + a.hold + 4)
            for _ in range(B)]
    try:
        pre = make_inputs(kind, a.ctx * B, rng)
        c.extend_packed(0, [(s, None, a.ctx) for s in seqs], *pre)
        q, k, v = make_inputs(kind, B, rng)
        steps = [(s, None, 1) for s in seqs]
        for _ in range(a.warmup):
            c.extend_packed(0, steps, q, k, v)
        for s in seqs:
            s.truncate(a.ctx)
        rec = {"wall_us": [], "cpu_us": [], "server_us": [], **{p: [] for p in PHASES}}
        prof = cProfile.Profile() if profile else None
        iters = a.iters if B == 1 else (a.iters_batched or a.iters)
        for i in range(iters):
            t = {}
            if prof:
                prof.enable()
            c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
            r = c.extend_packed(0, steps, q, k, v, timings=t)
            t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
            rec["cpu_us"].append((c1 - c0) / 1e3)
            if prof:
                prof.disable()
            rec["wall_us"].append((t1 - t0) / 1e3)
            rec["server_us"].append(r.report.times_us["total"])
            for p in PHASES:
                rec[p].append(t.get(p, 0.0))
            if isinstance(r.steps[0], Exception):
                raise r.steps[0]
            if (i + 1) % a.hold == 0:
                for s in seqs:
                    s.truncate(a.ctx)
        if prof:
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        rec["bare_us"], rec["bare_server_us"], rec["bare_cpu_us"] = bare_calls(
            c, steps, seqs, q, k, v, a, iters)
        return rec
    finally:
        for s in seqs:
            s.release()


def bare_calls(c, steps, seqs, q, k, v, a, iters):
    """The same decode calls as bare gRPC calls: each request's bytes built by the client
    beforehand and its reply read afterwards (both untimed), so only the channel's unary
    call of the identity-serialised ExtendBatch is timed → (wall µs, server total µs)."""
    from attention_client.extend_calls import Phases
    raw = c._raw_call("ExtendBatch")
    wall, server = [], []
    cpu = []
    for i in range(iters):
        call, req = c._packed_request(0, steps, q, k, v, False, None, None, 0, Phases(),
                                      raw=True)
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        resp = raw(req, timeout=60, metadata=None)
        t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
        cpu.append((c1 - c0) / 1e3)
        r = c._packed_finish(call, *c._packed_reply(resp, "ExtendBatch"), "ExtendBatch",
                             Phases())
        wall.append((t1 - t0) / 1e3)
        server.append(r.report.times_us["total"])
        if (i + 1) % a.hold == 0:
            for s in seqs:
                s.truncate(a.ctx)
    return wall, server, cpu


def offline(kind, B, iters, rng):
    """The client's own work per call with no RPC (a warm loop): extend_packed's request
    building and its reading of a canned reply like the server's (o of B·N·H bf16, B step
    results, a report) → µs per call (median of 5 rounds of iters)."""
    from attention_client._pb import attention_pb2 as pb
    from attention_client._pb import sequence_pb2 as spb
    from attention_client.extend_calls import Phases
    c = ac.AttentionClient("unix:/nonexistent-offline.sock")
    seqs = [ac.Sequence(c, spb.SequenceInfo(sequence_id=f"{i:032x}", num_layers=1,
                                            num_heads=N, num_kv_heads=K, head_dim=H,
                                            dtype=pb.BFLOAT16, layer_lengths=[100]))
            for i in range(B)]
    q, k, v = make_inputs(kind, B, rng)
    steps = [(s, None, 1) for s in seqs]
    resp = spb.ExtendBatchResponse()
    for _ in range(B):
        resp.steps.add(length=101, kv_len=101)
    resp.o.dtype = pb.BFLOAT16
    resp.o.shape.extend([B, N, H])
    resp.o.data = bytes(B * N * H * 2)
    resp.report.backend, resp.report.batch_size = "cpu", B
    buf = resp.SerializeToString()

    def one():
        tm = Phases()
        call, _ = c._packed_request(0, steps, q, k, v, False, None, None, 0, tm)
        c._packed_finish(call, *c._packed_reply(buf, "ExtendBatch"), "ExtendBatch", tm)

    rounds = []
    for r in range(6):
        t0 = time.perf_counter_ns()
        for _ in range(iters):
            one()
        if r:  # the first round warms up
            rounds.append((time.perf_counter_ns() - t0) / iters / 1e3)
    c.close()
    return float(np.median(rounds))


def summarize(kind, B, rec, floor_p50):
    own = [w - r for w, r in zip(rec["wall_us"], rec["rpc_us"])]
    gap = [r - s for r, s in zip(rec["rpc_us"], rec["server_us"])]
    row = {"kind": kind, "B": B, "calls": len(rec["wall_us"]),
           "wall_p50_us": pct(rec["wall_us"], 50), "wall_p99_us": pct(rec["wall_us"], 99),
           "server_p50_us": pct(rec["server_us"], 50), "own_p50_us": pct(own, 50),
           "own_p99_us": pct(own, 99), "rpc_minus_server_p50_us": pct(gap, 50),
           "floor_p50_us": floor_p50, "bare_p50_us": pct(rec["bare_us"], 50),
           "bare_p99_us": pct(rec["bare_us"], 99),
           "bare_server_p50_us": pct(rec["bare_server_us"], 50),
           "over_bare_p50_us": pct(rec["wall_us"], 50) - pct(rec["bare_us"], 50),
           "cpu_p50_us": pct(rec["cpu_us"], 50), "bare_cpu_p50_us": pct(rec["bare_cpu_us"], 50),
           "own_cpu_p50_us": pct(rec["cpu_us"], 50) - pct(rec["bare_cpu_us"], 50)}
    for p in PHASES:
        row[p.replace("_us", "_p50_us")] = pct(rec[p], 50)
    return row


def print_table(rows, floor_row):
    print(f"GetLoad floor: p50 {floor_row['p50_us']:.1f} us  p99 {floor_row['p99_us']:.1f} us"
          f"  thread CPU p50 {floor_row['cpu_p50_us']:.1f} us")
    cols = ["kind", "B", "wall_p50_us", "wall_p99_us", "own_p50_us", "gather_p50_us",
            "encode_p50_us", "rpc_p50_us", "decode_p50_us", "scatter_p50_us", "server_p50_us",
            "rpc_minus_server_p50_us", "bare_p50_us", "bare_server_p50_us", "over_bare_p50_us",
            "cpu_p50_us", "bare_cpu_p50_us", "own_cpu_p50_us"]
    heads = ["kind", "B", "wall p50", "wall p99", "own p50", "gather", "encode", "rpc",
             "decode", "scatter", "server", "rpc-srv", "bare p50", "bare srv", "wall-bare",
             "cpu p50", "bare cpu", "own cpu"]
    print(" ".join(f"{h:>9s}" for h in heads))
    for r in rows:
        print(" ".join(f"{r[c]:>9}" if isinstance(r[c], (str, int)) else f"{r[c]:9.1f}"
                       for c in cols))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", help="a running server (else --server starts one)")
    ap.add_argument("--server", default="build-cpu/server/attention-server")
    ap.add_argument("--transport", choices=("unix", "tcp"), default="unix")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--iters-batched", type=int, help="calls for B > 1 (default --iters)")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--hold", type=int, default=64, help="truncate back to ctx every N calls")
    ap.add_argument("--batch", type=int, action="append", help="B (repeatable; 1 and 32)")
    ap.add_argument("--kinds", default="numpy,torch_cpu", help="numpy,torch_cpu (when torch "
                    "is installed)")
    ap.add_argument("--cuda", action="store_true", help="also torch CUDA tensors (GPU host)")
    ap.add_argument("--profile", help="KIND:B to run under cProfile (e.g. numpy:1)")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--offline", action="store_true", help="no server: time the client's own "
                    "request building and reply reading on a canned reply (warm loop)")
    ap.add_argument("--client", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                     "..", "client", "python"),
                    help="folder holding the attention_client package (A/B of two versions)")
    a = ap.parse_args()
    global ac
    sys.path.insert(0, a.client)
    import attention_client as ac
    kinds = [k for k in a.kinds.split(",") if k]
    try:
        import torch
        have_cuda = torch.cuda.is_available()
    except ImportError:
        torch, have_cuda = None, False
        kinds = [k for k in kinds if k == "numpy"]
    if a.cuda:
        if not have_cuda:
            sys.exit("--cuda: torch.cuda is not available here")
        kinds.append("cuda")
    if a.offline:
        rng = np.random.default_rng(0)
        rows = [{"kind": kind, "B": B, "offline_us": offline(kind, B, a.iters, rng)}
                for kind in kinds for B in a.batch or [1, 32]]
        for r in rows:
            print(f"offline (no RPC) {r['kind']:>9s} B={r['B']:<3d} {r['offline_us']:8.1f} us/call")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"offline": True, "args": vars(a), "rows": rows}, f, indent=1)
        return
    proc, tmp = None, tempfile.mkdtemp(prefix="pyoverhead.")
    target = a.target
    if target is None:
        proc, target = start_server(a.server, a.transport, tmp)
    rng = np.random.default_rng(0)
    try:
        with ac.AttentionClient(target, timeout=60) as c:
            fl, fl_cpu = floor(c, a.iters)
            floor_row = {"p50_us": pct(fl, 50), "p99_us": pct(fl, 99),
                         "cpu_p50_us": pct(fl_cpu, 50)}
            rows = []
            for kind in kinds:
                for B in a.batch or [1, 32]:
                    rec = run_config(c, kind, B, a, rng, profile=a.profile == f"{kind}:{B}")
                    rows.append(summarize(kind, B, rec, floor_row["p50_us"]))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    print(f"target {target}  iters {a.iters}  ctx {a.ctx}..{a.ctx + a.hold}  "
          f"N{N} K{K} H{H} bf16  (us per call)")
    print_table(rows, floor_row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"target": target, "transport": a.transport if a.target is None else None,
                       "args": vars(a), "floor_getload": floor_row, "rows": rows,
                       "torch": getattr(torch, "__version__", None)}, f, indent=1)


if __name__ == "__main__":
    main()
