#!/usr/bin/env python3
"""Integration: open-loop latency exposes queueing that closed loop hides (no coordinated omission).

attention-server with one worker thread and one cpu thread; a request size is calibrated to take
~20 ms; a closed loop (--concurrency 1) runs for a few seconds and gives the server's throughput
X; an open loop at 1.5 X for the same duration must then report a p50 latency above 1.5x the
closed loop's (requests queue behind the saturated server, and open-loop latency counts from the
scheduled send time). Both runs must have 0 errors.
Usage: loadgen_open_vs_closed_test.py SERVER LOADGEN
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import time

DURATION_S = 3


def main(server, loadgen):
    with tempfile.TemporaryDirectory() as d:
        port_file = os.path.join(d, "port")
        log = open(os.path.join(d, "server.log"), "w")
        proc = subprocess.Popen([server, "--listen", "127.0.0.1:0", "--port-file", port_file,
                                 "--log-level", "warn", "--metrics-address", "", "--threads",
                                 "1", "--cpu-threads", "1",
                                 # The open loop's backlog (0.5 X calls a second of ~1.7 MB)
                                 # must not reach the server's in-flight byte cap (128 MiB by
                                 # default): that refuses calls and the run has errors.
                                 "--max-inflight-bytes", str(1 << 30)], stderr=log)
        try:
            for _ in range(300):
                if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
                    break
                time.sleep(0.1)
            target = "127.0.0.1:" + open(port_file).read().strip()

            def run(tokens, *extra):
                out = os.path.join(d, "report.json")
                subprocess.run([loadgen, "--target", target, "--workload", "fixed",
                                "--fixed-tokens", str(tokens), "--backend", "cpu", "--dtype",
                                "fp32", "--quiet", "--json", out, *extra], check=True,
                               stdout=subprocess.DEVNULL)
                with open(out) as f:
                    return json.load(f)

            # Calibrate: attention cost grows ~T^2, so scale T by sqrt(target / measured).
            tokens = 128
            for _ in range(4):
                p50 = run(tokens, "--requests", "5")["latency_ms"]["p50"]
                if 14 <= p50 <= 28:
                    break
                tokens = max(8, min(8192, int(round(tokens * math.sqrt(20.0 / max(p50, 0.05))))))
            print(f"request size: {tokens} tokens, ~{p50:.1f} ms")

            closed = run(tokens, "--mode", "closed", "--concurrency", "1", "--duration",
                         str(DURATION_S))
            x = closed["throughput"]["requests_per_s"]
            rate = 1.5 * x
            opened = run(tokens, "--mode", "open", "--rate", f"{rate:.3f}", "--duration",
                         str(DURATION_S))
            c50, o50 = closed["latency_ms"]["p50"], opened["latency_ms"]["p50"]
            print(f"closed: {x:.1f} req/s p50 {c50:.2f} ms errors {closed['requests']['errors']}")
            print(f"open at {rate:.1f} req/s: {opened['throughput']['requests_per_s']:.1f} req/s "
                  f"p50 {o50:.2f} ms errors {opened['requests']['errors']}")
            assert closed["requests"]["errors"] == 0, closed["errors"]
            assert opened["requests"]["errors"] == 0, opened["errors"]
            assert closed["requests"]["ok"] > 0 and opened["requests"]["ok"] > 0
            assert o50 > 1.5 * c50, f"open-loop p50 {o50} ms not > 1.5 x closed-loop p50 {c50} ms"
            print("PASS")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
