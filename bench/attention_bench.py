#!/usr/bin/env python3
"""Our attention kernels next to PyTorch's SDPA backends, in one run on one GPU.

1. Measures the roofline ceilings: bf16 tensor-core rate (torch 8192^3 matmul) and
   device-to-device copy bandwidth.
2. Runs the C++ benchmark (attn_kernel_bench: fused variants + naive, correctness checked first)
   and reads its JSON lines.
3. For the SAME shapes, times torch.nn.functional.scaled_dot_product_attention with each
   backend forced (FLASH_ATTENTION, EFFICIENT_ATTENTION, CUDNN_ATTENTION) with the same method:
   correctness first (float64 reference on sampled rows), then CUDA events, warm-up, median of
   interleaved repeats, each repeat = several launches rotating over >= 3 input sets
   (>= 2x L2 in total). The kernel that really ran is recorded from torch.profiler.
4. Writes one JSON document (device, versions, command, ceilings, every record) to
   $OUT/ (when OUT is set) and bench/results/<device>-<date>.json, and prints a table last.

Usage: python3 bench/attention_bench.py --bin build/bench/attn_kernel_bench [--suites=abc]
         [--dtype=bf16] [--reps=5] [--target-ms=20] [--quick] [--skip-torch]
FLOPs = 4*B*N*T*S*H, halved for causal.
"""
import argparse
import datetime
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
import time


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def measure_ceilings(torch):
    """bf16 matmul TFLOP/s (8192^3, random data) and D2D copy GB/s (read + write)."""
    dev = torch.device("cuda")
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(10):
            torch.matmul(a, b)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 10)
    mm_ms = sorted(times)[len(times) // 2]
    mma_tflops = 2 * n ** 3 / (mm_ms * 1e-3) / 1e12
    del a, b
    nbytes = 4 << 30
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(3):
            dst.copy_(src)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 3)
    cp_ms = sorted(times)[len(times) // 2]
    del src, dst
    torch.cuda.empty_cache()
    return {"bf16_matmul_8192_tflops": mma_tflops, "bf16_matmul_8192_ms": mm_ms,
            "d2d_copy_gbps_read_plus_write": 2 * nbytes / (cp_ms * 1e-3) / 1e9,
            "d2d_copy_bytes": nbytes}


def torch_sdpa_records(torch, shapes, dtype_name, reps, target_ms):
    """Times the three forced SDPA backends on each shape; returns result records."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    dtype = torch.bfloat16 if dtype_name == "bfloat16" else torch.float16
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    backends = [("torch_flash", SDPBackend.FLASH_ATTENTION),
                ("torch_efficient", SDPBackend.EFFICIENT_ATTENTION),
                ("torch_cudnn", SDPBackend.CUDNN_ATTENTION)]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    out = []
    for sh in shapes:
        B, N, K, H, T, S, causal = (sh[k] for k in ("B", "N", "K", "H", "T", "S", "causal"))
        flops = 4.0 * B * N * T * S * H / (2 if causal else 1)
        set_bytes = 2 * (2 * B * T * N * H + 2 * B * S * K * H)
        nsets = int(min(64, max(3, math.ceil(2 * l2 / set_bytes))))
        g = torch.Generator(device="cuda").manual_seed(1234)
        sets = []
        for _ in range(nsets):
            # Our layout (B, T, N, H) viewed as SDPA's (B, N, T, H): what FlashAttention reads.
            q = torch.randn(B, T, N, H, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
            k = torch.randn(B, S, K, H, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
            v = torch.randn(B, S, K, H, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
            sets.append((q, k, v))
        gqa = K != N

        def call(q, k, v):
            if gqa:
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        # float64 reference on sampled rows of set 0.
        q0, k0, v0 = sets[0]
        rows = []
        rng = torch.Generator().manual_seed(7)
        nsamp = 24 if S >= 8192 else 48
        for _ in range(nsamp):
            b = int(torch.randint(B, (1,), generator=rng))
            h = int(torch.randint(N, (1,), generator=rng))
            i = int(torch.randint(T, (1,), generator=rng))
            rows.append((b, h, i))
        rows[0] = (B - 1, N - 1, T - 1)
        ref = []
        for (b, h, i) in rows:
            kh = h // (N // K)
            qr = q0[b, h, i].double()
            kk = k0[b, kh].double()
            vv = v0[b, kh].double()
            logits = (kk @ qr) / math.sqrt(H)
            if causal:  # top-left == bottom-right for T == S
                logits[i + (S - T) + 1:] = -math.inf
            p = torch.softmax(logits, dim=0)
            ref.append(p @ vv)
        ref = torch.stack(ref)

        impls = []
        for name, be in backends:
            rec = {"record": "result", "shape": sh["shape"], "suite": sh["suite"], "B": B, "N": N,
                   "K": K, "H": H, "T": T, "S": S, "causal": causal, "dtype": dtype_name,
                   "impl": name, "flops": flops, "buffer_sets": nsets}
            try:
                with sdpa_kernel([be]):
                    o = call(q0, k0, v0)
                    torch.cuda.synchronize()
                got = torch.stack([o[b, h, i].double() for (b, h, i) in rows])
                rel = float(torch.linalg.norm(got - ref) / torch.linalg.norm(ref))
                row_rel = float(((got - ref).norm(dim=1) / ref.norm(dim=1)).max())
                nan = bool(torch.isnan(o).any())
                rec["check"] = {"passed": (not nan) and rel <= tol and row_rel <= 5 * tol,
                                "rel_l2": rel, "worst_row": row_rel, "nan": nan}
                with sdpa_kernel([be]):
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        call(q0, k0, v0)
                        torch.cuda.synchronize()
                names = sorted({e.name for e in prof.events()
                                if e.device_type is not None and "cuda" in str(e.device_type).lower()})
                rec["kernels"] = names[:8]
                impls.append((rec, be))
            except Exception as ex:  # backend refuses the shape: record why
                rec["error"] = f"{type(ex).__name__}: {str(ex).splitlines()[0][:300]}"
                out.append(rec)
        # Warm-up and calibration, then interleaved repeats.
        counter = 0
        for rec, be in impls:
            with sdpa_kernel([be]):
                for _ in range(3):
                    call(*sets[counter % nsets]); counter += 1
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(3):
                    call(*sets[counter % nsets]); counter += 1
                e1.record()
                e1.synchronize()
                rec["iters"] = int(min(2000, max(3, target_ms / max(e0.elapsed_time(e1) / 3, 1e-4))))
                rec["reps_ms"] = []
        for _ in range(reps):
            for rec, be in impls:
                with sdpa_kernel([be]):
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    for _ in range(rec["iters"]):
                        call(*sets[counter % nsets]); counter += 1
                    e1.record()
                    e1.synchronize()
                    rec["reps_ms"].append(e0.elapsed_time(e1) / rec["iters"])
        for rec, _ in impls:
            r = sorted(rec["reps_ms"])
            ms = r[len(r) // 2] if len(r) % 2 else 0.5 * (r[len(r) // 2 - 1] + r[len(r) // 2])
            rec["ms"] = ms
            rec["tflops"] = flops / (ms * 1e-3) / 1e12
            out.append(rec)
            log(f"  {sh['shape']:40s} {rec['impl']:16s} {rec['tflops']:7.1f} TFLOP/s "
                f"check={'ok' if rec['check']['passed'] else 'FAIL'} {rec.get('kernels', [''])[:1]}")
        del sets, impls
        torch.cuda.empty_cache()
    return out


def versions(torch):
    v = {"python": platform.python_version()}
    if torch is not None:
        v["torch"] = torch.__version__
        v["torch_cuda"] = torch.version.cuda
        try:
            v["cudnn"] = torch.backends.cudnn.version()
        except Exception:
            pass
    try:
        import jax  # noqa: F401
        v["jax"] = jax.__version__
    except Exception:
        pass
    try:
        v["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,memory.total",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:
        pass
    try:
        v["nvcc"] = subprocess.run(["nvcc", "--version"], capture_output=True, text=True,
                                   timeout=30).stdout.strip().splitlines()[-1]
    except Exception:
        pass
    return v


def table(records):
    """Rows: shape -> impl -> record."""
    by = {}
    order = []
    for r in records:
        if r.get("record") != "result":
            continue
        if r["shape"] not in by:
            by[r["shape"]] = {}
            order.append(r["shape"])
        by[r["shape"]][r["impl"]] = r
    def tf(d, k):
        r = d.get(k)
        if r is None or "tflops" not in r:
            return None
        return r["tflops"]
    lines = []
    hdr = (f"{'shape':44s} {'fused':>7s} {'dvar':>4s} {'best':>7s} {'bestvar':>8s} {'naive':>7s} "
           f"{'flash':>7s} {'effic':>7s} {'cudnn':>7s} {'f/flash':>7s} {'b/flash':>7s} {'ok':>3s}")
    lines.append(hdr)
    ratios_b = []
    best_ratios_b = []
    for sh in order:
        d = by[sh]
        fused = tf(d, "fused")
        # "fused" is the default plan (FusedPlanFor, variant -1); "fused/v<i>" every variant.
        m = re.search(r" v(\d+) ", d.get("fused", {}).get("detail", ""))
        dvar = f"v{m.group(1)}" if m else "-"
        variants = {k: tf(d, k) for k in d if k.startswith("fused/")} or {"fused": fused}
        best_k = max((k for k in variants if variants[k] is not None), key=lambda k: variants[k],
                     default=None)
        best = variants.get(best_k) if best_k else None
        flash = tf(d, "torch_flash")
        ok = all(r.get("check", {}).get("passed", True) for r in d.values() if "check" in r)
        ratio = fused / flash if (fused and flash) else None
        bratio = best / flash if (best and flash) else None
        if ratio and sh.startswith("b/"):
            ratios_b.append(ratio)
        if bratio and sh.startswith("b/"):
            best_ratios_b.append(bratio)
        f = lambda x: f"{x:7.1f}" if x is not None else f"{'-':>7s}"
        lines.append(f"{sh:44s} {f(fused)} {dvar:>4s} {f(best)} "
                     f"{(best_k or '-').replace('fused', 'f'):>8s} "
                     f"{f(tf(d, 'naive'))} {f(flash)} {f(tf(d, 'torch_efficient'))} "
                     f"{f(tf(d, 'torch_cudnn'))} {(f'{ratio:7.2f}' if ratio else '      -')} "
                     f"{(f'{bratio:7.2f}' if bratio else '      -')} "
                     f"{'ok' if ok else 'BAD':>3s}")
    gmean = lambda xs: math.exp(sum(math.log(r) for r in xs) / len(xs)) if xs else None
    geo = gmean(ratios_b)
    lines.append(f"geometric mean of fused/flash over suite (b): "
                 f"{geo:.3f} over {len(ratios_b)} shapes, min {min(ratios_b):.3f}, "
                 f"{sum(r < 0.95 for r in ratios_b)} below 0.95 (fused = the default plan)"
                 if geo else "geometric mean of fused/flash over suite (b): n/a")
    bgeo = gmean(best_ratios_b)
    if bgeo:
        lines.append(f"with the best variant per shape instead: {bgeo:.3f}, "
                     f"min {min(best_ratios_b):.3f}")
    # cudnn family: our cudnn backend vs PyTorch's cudnn SDPA (the same libcudnn when our search,
    # kernels/include/attn/kernels/cudnn_library.h, picks torch's env's), and fp8 (amax + quantisation + output conversion included) vs our
    # cudnn; graph build (cold start) seconds from the "graph_build" records.
    builds = {(r["shape"], r["impl"]): r["seconds"] for r in records
              if r.get("record") == "graph_build"}
    if any(tf(by[sh], "cudnn") for sh in order):
        lines.append("")
        lines.append(f"{'shape':44s} {'cudnn':>7s} {'t_cudnn':>7s} {'c/t':>6s} {'fp8':>7s} "
                     f"{'fp8/c':>6s} {'build_s':>8s} {'ok':>3s}")
        for sh in order:
            d = by[sh]
            c, t, f8 = tf(d, "cudnn"), tf(d, "torch_cudnn"), tf(d, "fp8")
            ok = all(d[k].get("check", {}).get("passed", True) for k in ("cudnn", "fp8") if k in d)
            g = lambda x: f"{x:7.1f}" if x is not None else f"{'-':>7s}"
            lines.append(f"{sh:44s} {g(c)} {g(t)} "
                         f"{(f'{c / t:6.2f}' if (c and t) else '     -')} {g(f8)} "
                         f"{(f'{f8 / c:6.2f}' if (c and f8) else '     -')} "
                         f"{builds.get((sh, 'cudnn'), float('nan')):8.3f} {'ok' if ok else 'BAD':>3s}")
    return "\n".join(lines), geo


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True, help="path to attn_kernel_bench")
    ap.add_argument("--suites", default="abc")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--target-ms", type=float, default=20)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--bin-args", default="", help="extra arguments for the binary")
    ap.add_argument("--results-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                           "results"))
    args = ap.parse_args()
    t_start = time.time()
    command = " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv)

    torch = None
    if not args.skip_torch:
        try:
            import torch as _t
            torch = _t
        except Exception as ex:
            log(f"torch unavailable: {ex}")
    ceilings = {}
    if torch is not None and torch.cuda.is_available():
        log("measuring ceilings (bf16 8192^3 matmul, 4 GiB D2D copy) ...")
        ceilings = measure_ceilings(torch)
        log(f"  {ceilings}")

    bin_cmd = [args.bin, f"--suites={args.suites}", f"--dtype={args.dtype}", f"--reps={args.reps}",
               f"--target-ms={args.target_ms}"] + (["--quick"] if args.quick else []) + \
        shlex.split(args.bin_args)
    log("running " + " ".join(bin_cmd))
    proc = subprocess.run(bin_cmd, capture_output=True, text=True)
    sys.stderr.write(proc.stderr)
    records = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                log("unparsable line: " + line[:200])
    device_rec = next((r for r in records if r.get("record") == "device"), {})
    log(f"binary exit status {proc.returncode}, {len(records)} records")

    shapes = []
    seen = set()
    for r in records:
        if r.get("record") == "result" and r["shape"] not in seen:
            seen.add(r["shape"])
            shapes.append({k: r[k] for k in ("shape", "suite", "B", "N", "K", "H", "T", "S", "causal")})
    if torch is not None and torch.cuda.is_available():
        dtype_name = "bfloat16" if args.dtype == "bf16" else "float16"
        log(f"timing torch SDPA backends on {len(shapes)} shapes ...")
        records += torch_sdpa_records(torch, shapes, dtype_name, args.reps, args.target_ms)

    text, geo = table(records)
    device_name = device_rec.get("device", "unknown")
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    date = datetime.date.today().isoformat()
    doc = {"device": device_rec, "versions": versions(torch), "command": command,
           "binary_command": " ".join(bin_cmd), "binary_exit_status": proc.returncode,
           "ceilings": ceilings, "geomean_fused_over_flash_suite_b": geo,
           "wall_s": time.time() - t_start, "records": records, "table": text.splitlines()}
    paths = []
    os.makedirs(args.results_dir, exist_ok=True)
    paths.append(os.path.join(args.results_dir, f"{slug}-{date}.json"))
    if os.environ.get("OUT"):
        os.makedirs(os.environ["OUT"], exist_ok=True)
        paths.append(os.path.join(os.environ["OUT"], f"{slug}-{date}.json"))
    for p in paths:
        with open(p, "w") as f:
            json.dump(doc, f, indent=1)
        log(f"wrote {p}")
    if ceilings:
        print(f"ceilings: bf16 matmul {ceilings['bf16_matmul_8192_tflops']:.0f} TFLOP/s, "
              f"D2D copy {ceilings['d2d_copy_gbps_read_plus_write']:.0f} GB/s (read+write)")
    print(f"binary checks: {'all passed' if proc.returncode == 0 else 'FAILED (see records)'}")
    print(text)
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
