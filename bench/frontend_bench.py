#!/usr/bin/env python3
"""A transformers causal LM decoding through attention-server, against its own local loop.

Model: a Llama-3.2-1B-like LlamaForCausalLM with random weights from --seed (16 layers, hidden
2048, 32 q / 8 kv heads, head dim 64, intermediate 8192, vocab 128256, bf16 by default; every
size is a flag). For every prompt length P and batch B (same-length prompts of random tokens):
  local:  the model's fastest local greedy loop that works here (static cache +
          torch.compile / CUDA graphs, else the dynamic cache; the JSON says which and why);
  server: the same loop with the model attached (attention_client.transformers_integration:
          no model-side KV cache, one ExtendBatch per layer per step for all rows), per
          transport (TCP, Unix socket) and --regions mode: none (bytes in the messages: rows
          tcp, unix), cuda (transport_region="cuda", a CUDA IPC region on the server's GPU:
          rows tcp+cudaipc, unix+cudaipc; checked: every ExtendBatch used it), auto (+auto).
Reported: prefill time, ms per decode step and tokens/s (p50/mean), per-layer call breakdown
(adapter conversion, client call, client+transport, server phases; p50/p99); teacher-forced
logits against the local full forward pass with the local noise floor (incremental KV cache vs
full forward); empty-call baselines (GetLoad and health from Python; the nearest C++ floor,
a tiny Attend, from attention-loadgen: it has no empty-call mode).
Checks that fail the run (exit 1): the server's attn_requests_total{method="ExtendBatch",
code="OK"} grew by exactly the ExtendBatch calls the client sent (>= layers x forward passes),
and, before release, every row's server sequence holds P + new tokens in every layer (so
layers x steps x batch Extend steps landed on the server; the server has no counter of steps
themselves). No silent local fallback can pass.

Usage (GPU host):
  python3 bench/frontend_bench.py --server-bin build/server/attention-server --kv-device gpu
      [--transports tcp,unix] [--regions none,cuda] [--batches 1,8,32,64] [--prompts 512,8192]
      [--new-tokens 64] [--loadgen build/client/attention-loadgen]
  or against running servers (sized with --kv-cache-bytes for the largest case):
      --target tcp=127.0.0.1:50051,http://127.0.0.1:9464/metrics
      --target unix=unix:/run/attn.sock,http://127.0.0.1:9464/metrics
CPU smoke test: --device cpu --dtype float32 --kv-device cpu --layers 2 --hidden 64
  --intermediate 128 --heads 4 --kv-heads 2 --head-dim 16 --vocab 97 --batches 1,3
  --prompts 8 --new-tokens 4 --local-loop dynamic
Writes bench/results/frontend-<device>-<date>.json (and $OUT/ when set) with the command.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "client", "python"))
sys.path.insert(0, HERE)
import frontend_measure as fm  # noqa: E402


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def ints(s):
    return [int(x) for x in s.split(",") if x]


REGION_SUFFIX = {"none": "", "cuda": "+cudaipc", "auto": "+auto"}  # --regions mode → row name


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_argument_group("model")
    for name, default in (("layers", 16), ("hidden", 2048), ("heads", 32), ("kv-heads", 8),
                          ("head-dim", 64), ("intermediate", 8192), ("vocab", 128256),
                          ("seed", 0)):
        g.add_argument(f"--{name}", type=int, default=default)
    g.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    g.add_argument("--device", default="cuda")
    r = ap.add_argument_group("run")
    r.add_argument("--batches", type=ints, default=[1, 8, 32, 64])
    r.add_argument("--prompts", type=ints, default=[512, 8192])
    r.add_argument("--new-tokens", type=int, default=64)
    r.add_argument("--local-loop", default="auto", choices=["auto", "static", "dynamic"])
    r.add_argument("--tf-rows", type=int, default=4, help="teacher-forced rows")
    r.add_argument("--tf-prompt", type=int, default=128, help="teacher-forced prompt tokens")
    r.add_argument("--tf-tokens", type=int, default=32, help="teacher-forced positions")
    r.add_argument("--baseline-calls", type=int, default=2000)
    r.add_argument("--max-call-mb", type=int, default=128,
                   help="split a layer step above this many MiB of q+k+v")
    s = ap.add_argument_group("server")
    s.add_argument("--server-bin", help="start attention-server from this path per transport")
    s.add_argument("--transports", default="tcp,unix", help="with --server-bin")
    s.add_argument("--kv-device", default="gpu", help="with --server-bin")
    s.add_argument("--server-compile", default="unix",
                   help="transports (comma-separated, '' for none) that also run each case with "
                        "model.forward under torch.compile, attention still on the server")
    s.add_argument("--regions", default="none",
                   help="comma-separated transport_region modes per server: none (bytes), "
                        "cuda (CUDA IPC region; rows NAME+cudaipc), auto (rows NAME+auto)")
    s.add_argument("--server-arg", action="append", default=[], help="extra server flag")
    s.add_argument("--target", action="append", default=[],
                   help="NAME=ADDRESS[,METRICS_URL] of a running server (instead of "
                        "--server-bin); its KV cache must hold the largest case")
    s.add_argument("--metrics-url", help="/metrics for --target entries without their own")
    s.add_argument("--loadgen", help="attention-loadgen, for the C++ baseline")
    ap.add_argument("--out", help="JSON path (default bench/results/frontend-<dev>-<date>.json)")
    a = ap.parse_args()
    a.regions = [m for m in a.regions.split(",") if m]
    if not a.regions or set(a.regions) - set(REGION_SUFFIX):
        ap.error(f"--regions: modes from {sorted(REGION_SUFFIX)}, got {a.regions}")
    return a


def free_port():
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


class Server:
    """attention-server as a subprocess on one transport; .target, .metrics_url."""

    def __init__(self, a, transport, tmp):
        mport = free_port()
        self.metrics_url = f"http://127.0.0.1:{mport}/metrics"
        port_file = os.path.join(tmp, f"{transport}.port")
        if transport == "tcp":
            listen = "127.0.0.1:0"
        elif transport == "unix":
            listen = "unix:" + os.path.join(tmp, "attn.sock")
        else:
            raise ValueError(f"unknown transport {transport!r} (tcp, unix)")
        self.cmd = [a.server_bin, "--listen", listen, "--port-file", port_file,
                    "--kv-device", a.kv_device, "--metrics-address", f"127.0.0.1:{mport}",
                    "--log-level", "warn"]
        if not any(x.startswith("--kv-cache-bytes") for x in a.server_arg):
            self.cmd += ["--kv-cache-bytes", str(kv_bytes_needed(a))]
        self.cmd += a.server_arg
        self.log = open(os.path.join(tmp, f"{transport}.log"), "w+")
        self.proc = subprocess.Popen(self.cmd, stderr=self.log, stdout=self.log)
        for _ in range(600):
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"server exited {self.proc.returncode}: "
                                   f"{self.log.read()[-800:]}")
            if transport == "tcp" and os.path.exists(port_file) and \
                    open(port_file).read().strip():
                self.target = f"127.0.0.1:{int(open(port_file).read())}"
                return
            if transport == "unix" and os.path.exists(listen[5:]):
                self.target = listen
                return
            time.sleep(0.1)
        raise RuntimeError("server did not come up in 60 s")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def kv_bytes_needed(a):
    """KV pool for the largest case (all rows, every layer, 16-token pages) with 25 % headroom;
    the server's default (1 GiB) holds only small cases."""
    itemsize = 4 if a.dtype == "float32" else 2
    tokens = -(-(max(a.prompts + [a.tf_prompt]) + a.new_tokens + a.tf_tokens + 16) // 16) * 16
    per_row = tokens * a.layers * a.kv_heads * a.head_dim * 2 * itemsize
    return int(1.25 * max(a.batches + [a.tf_rows]) * per_row) + (64 << 20)


def plain(res):
    """A measurement dict without tensors / timing objects, for the JSON."""
    out = {k: v for k, v in res.items() if k not in ("first_logits", "prefill_calls",
                                                     "decode_calls", "step_ms")}
    if "step_ms" in res:
        out["step_ms"] = fm.summary(res["step_ms"])
    return out


def server_case(a, name, attached, metrics_url, model, P, B, ids, local, torch, failures,
                compiled=False):
    """One (prompt P, batch B) case through the server: the greedy loop, per-layer-call
    breakdown and the checks (row x layer steps, ExtendBatch counts, sequence lengths).
    compiled: model.forward wrapped in torch.compile (mode reduce-overhead on CUDA) while the
    attention calls stay eager RPCs (attention_server_forward is torch.compiler.disable'd): one
    warm-up conversation compiles, the measured one follows; the compiled graphs are dropped
    afterwards."""
    case = {"prompt": P, "batch": B}
    fwd0 = model.forward
    try:
        if compiled:
            cmode = "reduce-overhead" if ids.device.type == "cuda" else "default"
            model.forward = torch.compile(fwd0, mode=cmode, dynamic=False)
            case["loop"] = f"torch.compile(model.forward, mode={cmode}), attention on the server"
            t0 = time.perf_counter()
            with attached() as am:
                fm.server_decode(am, ids, min(a.new_tokens, 8), torch)
            case["compile_warmup_s"] = time.perf_counter() - t0
        before = fm.extend_batch_ok(metrics_url)
        with attached() as am:
            st = am.session.stats
            steps0, region0 = st.extend_steps, st.region_calls
            r = fm.server_decode(am, ids, a.new_tokens, torch)
            steps = st.extend_steps - steps0
            region = None if am.session.calls.transport is None else {
                "mode": am.session.calls.transport.mode, "calls": st.region_calls - region0,
                "leases": st.region_leases, "fallback": st.transport_fallback}
        after = fm.extend_batch_ok(metrics_url)
        case.update(plain(r))
        case["prefill_layer_calls"] = fm.call_breakdown(r["prefill_calls"])
        case["decode_layer_calls"] = fm.call_breakdown(r["decode_calls"])
        want = a.layers * (1 + a.new_tokens)
        checks = {"extend_steps": steps, "extend_steps_expected": want * B,
                  "rpcs": r["rpcs"], "server_extendbatch_delta":
                  None if before is None else after - before}
        if region is not None:
            checks["region"] = region
            if region["mode"] == "cuda" and region["calls"] != r["rpcs"]:
                failures.append(f"{name} P={P} B={B}: {region['calls']} of {r['rpcs']} "
                                "ExtendBatch calls went through the CUDA IPC region")
        case["checks"] = checks
        if steps != want * B:
            failures.append(f"{name} P={P} B={B}: {steps} row x layer steps, "
                            f"expected {want * B}")
        if r["rows_with_wrong_length"]:
            failures.append(f"{name} P={P} B={B}: rows {r['rows_with_wrong_length']} "
                            f"do not hold {r['expected_length']} tokens per layer")
        if r["rpcs"] < want:
            failures.append(f"{name} P={P} B={B}: {r['rpcs']} ExtendBatch calls < "
                            f"layers x forwards = {want}")
        if before is not None and after - before != r["rpcs"]:
            failures.append(f"{name} P={P} B={B}: server counted {after - before} "
                            f"ExtendBatch calls, client sent {r['rpcs']}")
        if local.get("first_logits") is not None:
            d = (r["first_logits"] - local["first_logits"]).abs().max()
            case["prefill_logits_max_abs_vs_local"] = float(d)
    except Exception as e:  # noqa: BLE001 - recorded; the other cases still run
        case["error"] = f"{type(e).__name__}: {str(e)[:500]}"
        failures.append(f"{name} P={P} B={B}: {case['error']}")
    finally:
        if compiled:
            model.forward = fwd0
            torch._dynamo.reset()
    log(f"[{name}] P={P} B={B}: " + (case.get("error") or
        f"{case['step_ms']['p50']:.2f} ms/step, prefill {case['prefill_s']:.3f} s"))
    return case


def run_server(a, name, target, metrics_url, model, cases, torch, grpc, failures, servers,
               command=None):
    """run_transport once per --regions mode, into servers[NAME + REGION_SUFFIX[mode]]; the
    empty-call baselines only with the first mode (they do not depend on it)."""
    for i, mode in enumerate(a.regions):
        label = name + REGION_SUFFIX[mode]
        servers[label] = run_transport(a, label, target, metrics_url, model, cases, torch, grpc,
                                       failures, region=mode, baselines=i == 0)
        if command:
            servers[label]["server_command"] = command


def run_transport(a, name, target, metrics_url, model, cases, torch, grpc, failures,
                  region="none", baselines=True):
    from attention_client import AttentionClient
    from attention_client.transformers_integration import attach
    res = {"target": target, "cases": [], "metrics_url": metrics_url}
    if region != "none":
        res["transport_region"] = region
    with AttentionClient(target, timeout=600) as client:
        info = client.server_info()
        res["server"] = {"version": info.version, "device": info.device_name,
                         "kv_device": info.kv_cache.device,
                         "cuda_ipc_regions": info.cuda_ipc_regions}

        def attached():
            return attach(model, client, max_call_bytes=a.max_call_mb << 20,
                          transport_region=None if region == "none" else region)
        for (P, B), ids, local in cases:
            case = server_case(a, name, attached, metrics_url, model, P, B, ids, local, torch,
                               failures)
            res["cases"].append(case)
            if name in a.server_compile.split(","):
                res.setdefault("compiled_cases", []).append(
                    server_case(a, name + "+compile", attached, metrics_url, model, P, B, ids,
                                local, torch, failures, compiled=True))
        try:
            g = torch.Generator().manual_seed(a.seed + 1)
            tf_ids = torch.randint(0, a.vocab, (a.tf_rows, a.tf_prompt), generator=g).to(
                a.device)
            res["teacher_forced"] = fm.teacher_forced(model, attached, tf_ids, a.tf_tokens,
                                                      torch)
        except Exception as e:  # noqa: BLE001
            res["teacher_forced"] = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
            failures.append(f"{name} teacher-forced: {res['teacher_forced']['error']}")
        if baselines:
            res["python_empty_calls_us"] = fm.python_empty_calls(client, grpc, target,
                                                                 a.baseline_calls)
            res["cpp_tiny_calls"] = fm.cpp_tiny_calls(a.loadgen, target, a.baseline_calls)
    return res


def table(doc, layers):
    rows = [("transport", "P", "B", "local p50 ms", "server p50 ms", "added/layer ms",
             "local tok/s", "server tok/s", "local prefill s", "server prefill s",
             "call p50/p99 ms", "convert p50 ms", "srv total p50 ms", "kernel p50 ms")]
    local = {(c["prompt"], c["batch"]): c for c in doc["local"]}
    for name, t in doc["server"].items():
        labelled = [(name, c) for c in t.get("cases", [])] + \
            [(name + "+compile", c) for c in t.get("compiled_cases", [])]
        for label, c in labelled:
            lc = local.get((c["prompt"], c["batch"]), {})
            if "error" in c or "error" in lc:
                rows.append((label, c["prompt"], c["batch"], "error", c.get("error", "")[:40]
                             or lc.get("error", "")[:40]) + ("",) * 9)
                continue
            lm, sm = lc["step_ms"]["p50"], c["step_ms"]["p50"]
            dc = c["decode_layer_calls"] or {}
            f = (lambda k, q="p50": (dc.get(k) or {}).get(q, 0) / 1e3) if dc else (lambda *x: 0)
            rows.append((label, c["prompt"], c["batch"], f"{lm:.2f}", f"{sm:.2f}",
                         f"{(sm - lm) / layers:.3f}",
                         f"{c['batch'] * 1e3 / lc['step_ms']['mean']:.0f}",
                         f"{c['batch'] * 1e3 / c['step_ms']['mean']:.0f}",
                         f"{lc['prefill_s']:.3f}", f"{c['prefill_s']:.3f}",
                         f"{f('client_call_us'):.2f}/{f('client_call_us', 'p99'):.2f}",
                         f"{f('convert_us'):.2f}", f"{f('server_total_us'):.2f}",
                         f"{f('server_kernel_us'):.3f}"))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(v).rjust(w) for v, w in zip(r, widths)) for r in rows]
    for name, t in doc["server"].items():
        tf = t.get("teacher_forced", {})
        if "server_vs_full" in tf:
            s, fl = tf["server_vs_full"], tf["local_incremental_vs_full"]
            lines.append(f"[{name}] teacher-forced vs full forward: server max abs "
                         f"{s['max_abs']:.4g} rel {s['max_rel']:.3g} argmax "
                         f"{s['argmax_agreement']:.3f}; local incremental (floor) max abs "
                         f"{fl['max_abs']:.4g} rel {fl['max_rel']:.3g} argmax "
                         f"{fl['argmax_agreement']:.3f}; within floor: "
                         f"{tf['within_noise_floor']}, argmax ok: "
                         f"{tf['argmax_within_one_point']}")
        for call, sm in (t.get("python_empty_calls_us") or {}).items():
            lines.append(f"[{name}] Python {call}: p50 {sm['p50']:.0f} us, p99 "
                         f"{sm['p99']:.0f} us")
        for c in t.get("cases", []):
            for kind in ("prefill", "decode"):
                lc = c.get(f"{kind}_layer_calls") or {}
                if "client_rpc_us" not in lc:
                    continue
                lines.append(f"[{name}] P={c['prompt']} B={c['batch']} {kind} layer call, client "
                             "phases p50 ms: " + ", ".join(
                                 f"{ph} {lc[f'client_{ph}_us']['p50'] / 1e3:.3f}" for ph in
                                 ("gather", "encode", "rpc", "decode", "scatter")))
        cpp = t.get("cpp_tiny_calls", {})
        if cpp.get("latency_ms"):
            lines.append(f"[{name}] C++ tiny Attend (loadgen): p50 "
                         f"{cpp['latency_ms']['p50'] * 1e3:.0f} us, p99 "
                         f"{cpp['latency_ms']['p99'] * 1e3:.0f} us")
    lines.append("ms: decode step p50; added/layer: (server - local) / layers; tok/s: B / mean "
                 "step; layer call columns: decode steps (JSON: prefill too)")
    lines.append("local loop: " + ", ".join(sorted({c.get("loop", "?") for c in doc["local"]})))
    return "\n".join(lines)


def main():
    a = parse_args()
    import grpc
    import torch
    import transformers
    command = " ".join(shlex.quote(x) for x in [sys.executable] + sys.argv)
    model = fm.build_model(a, torch, transformers)
    dev = torch.device(a.device)
    devname = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() \
        or "cpu"
    log(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters on "
        f"{devname}")
    cases, local_res = [], []
    for P in a.prompts:
        for B in a.batches:
            g = torch.Generator().manual_seed(a.seed * 7919 + P * 131 + B)
            ids = torch.randint(0, a.vocab, (B, P), generator=g).to(dev)
            try:
                lr = fm.local_decode(model, ids, a.new_tokens, a.local_loop, torch,
                                     transformers)
                log(f"[local] P={P} B={B}: {fm.summary(lr['step_ms'])['p50']:.2f} ms/step "
                    f"({lr['loop']})")
            except Exception as e:  # noqa: BLE001 - e.g. out of memory: recorded
                lr = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
                log(f"[local] P={P} B={B}: {lr['error']}")
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
            local_res.append(dict(plain(lr), prompt=P, batch=B))
            cases.append(((P, B), ids, lr))
    failures, servers = [], {}
    if dev.type == "cuda":
        torch.cuda.empty_cache()  # the server sizes its pool from the free memory at start
    with tempfile.TemporaryDirectory() as tmp:
        if a.target:
            for t in a.target:
                name, _, addr = t.partition("=")
                addr, _, murl = addr.partition(",")
                run_server(a, name, addr, murl or a.metrics_url, model, cases, torch, grpc,
                           failures, servers)
        elif a.server_bin:
            for name in a.transports.split(","):
                try:
                    srv = Server(a, name, tmp)
                except Exception as e:  # noqa: BLE001 - e.g. no unix: support: recorded
                    servers[name] = {"error": f"{type(e).__name__}: {str(e)[:800]}"}
                    failures.append(f"{name}: server did not start: {servers[name]['error']}")
                    continue
                try:
                    run_server(a, name, srv.target, srv.metrics_url, model, cases, torch, grpc,
                               failures, servers, command=" ".join(srv.cmd))
                finally:
                    srv.stop()
        else:
            sys.exit("give --server-bin PATH or --target NAME=ADDRESS")
    doc = {"command": command, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "host": platform.node(), "device": devname,
           "versions": {"python": platform.python_version(), "torch": torch.__version__,
                        "transformers": transformers.__version__, "grpcio": grpc.__version__},
           "model": {k: getattr(a, k) for k in ("layers", "hidden", "heads", "kv_heads",
                                                "head_dim", "intermediate", "vocab", "dtype",
                                                "seed")},
           "new_tokens": a.new_tokens, "local": local_res, "server": servers,
           "failures": failures}
    slug = re.sub(r"[^a-z0-9]+", "-", devname.lower()).strip("-") or "cpu"
    name = f"frontend-{slug}-{datetime.date.today().isoformat()}.json"
    paths = [a.out or os.path.join(HERE, "results", name)]
    if os.environ.get("OUT"):
        paths.append(os.path.join(os.environ["OUT"], name))
    for p in paths:
        os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
        with open(p, "w") as f:
            json.dump(doc, f, indent=1)
    print(table(doc, a.layers))
    print("wrote " + ", ".join(paths))
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
