#!/usr/bin/env python3
"""Integration: attention-loadgen keeps its report on SIGINT/SIGTERM, warns when an open loop
falls behind its offered rate, and the sweep refuses a backend the server does not have.

Against a live attention-server (cpu backend, loopback):
  * SIGINT / SIGTERM mid-run of the closed loop, the open loop, the trace replay and the session
    workload: exit 130 / 143, a printed report marked INTERRUPTED, and a valid --json file with
    interrupted=true and completed > 0 (planned as asked);
  * a call still in flight 2 s after the signal is cancelled: the loadgen exits within the grace
    period (plus slack) with the call counted CANCELLED, and the JSON is still written;
  * a second signal exits at once, without waiting for the grace period;
  * an open loop offered more than the cpu backend can serve warns on stderr and in the JSON's
    "warnings"; one offered little does not;
  * `sweep --backends cpu,nosuch` exits 2 naming the missing backend and the available ones;
    a sweep interrupted by SIGINT writes the points done so far and exits 130.
Every wait is bounded. Usage: loadgen_interrupt_test.py SERVER LOADGEN
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

def start_server(server, d):
    port_file = os.path.join(d, "port")
    log = open(os.path.join(d, "server.log"), "w")
    proc = subprocess.Popen([server, "--listen", "127.0.0.1:0", "--port-file", port_file,
                             "--log-level", "warn", "--metrics-address", ""], stderr=log)
    for _ in range(300):
        if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
            return proc, "127.0.0.1:" + open(port_file).read().strip()
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("server did not start")


def interrupted_run(loadgen, args, sig, after_s, json_path, second_after_s=None):
    """Starts the loadgen, sends `sig` after `after_s` (and again after `second_after_s`),
    returns (rc, stdout, stderr, seconds from the first signal to exit)."""
    proc = subprocess.Popen([loadgen, *args, "--quiet", "--json", json_path],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(after_s)
    assert proc.poll() is None, f"loadgen ended before the signal: {proc.communicate()}"
    t0 = time.monotonic()
    proc.send_signal(sig)
    if second_after_s is not None:
        time.sleep(second_after_s)
        proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"loadgen did not exit within 30 s of {sig}")
    return proc.returncode, out, err, time.monotonic() - t0


def check_interrupted(name, rc, out, err, json_path, sig, expect_rc, completed_key, planned):
    assert rc == expect_rc, f"{name}: exit {rc}, want {expect_rc}\n{out}\n{err}"
    assert f"INTERRUPTED" in out and f"by {sig}: partial report" in out, f"{name}:\n{out}"
    with open(json_path) as f:
        j = json.load(f)
    assert j["interrupted"] is True and j["interrupted_by"] == sig, f"{name}: {j}"
    completed = completed_key(j)
    assert completed > 0, f"{name}: completed {completed}: {j}"
    assert planned(j) is None or planned(j) >= completed, f"{name}: {j}"
    print(f"{name}: exit {rc}, completed {completed}")
    return j


def main(server, loadgen):
    with tempfile.TemporaryDirectory() as d:
        proc, target = start_server(server, d)
        jp = os.path.join(d, "r.json")
        plain = ["--target", target, "--backend", "cpu", "--dtype", "fp32"]
        base = [*plain, "--heads", "4", "--kv-heads", "4", "--head-dim", "32"]
        requests = lambda j: j["requests"]["completed"]
        try:
            # Closed loop, SIGINT.
            rc, out, err, _ = interrupted_run(
                loadgen, [*base, "--workload", "fixed", "--fixed-tokens", "64", "--requests",
                          "1000000", "--concurrency", "2"], signal.SIGINT, 1.5, jp)
            j = check_interrupted("closed SIGINT", rc, out, err, jp, "SIGINT", 130, requests,
                                  lambda j: j["requests"]["planned"])
            assert j["requests"]["planned"] == 1000000, j["requests"]
            assert j["requests"]["errors"] == 0, j["errors"]
            # Open loop, SIGTERM.
            rc, out, err, _ = interrupted_run(
                loadgen, [*base, "--workload", "fixed", "--fixed-tokens", "32", "--mode", "open",
                          "--rate", "40", "--requests", "100000"], signal.SIGTERM, 1.5, jp)
            check_interrupted("open SIGTERM", rc, out, err, jp, "SIGTERM", 143, requests,
                              lambda j: j["requests"]["planned"])
            # Trace replay (timestamps honoured), SIGINT.
            rc, out, err, _ = interrupted_run(
                loadgen, [*base, "--workload", "trace", "--max-tokens", "64", "--time-scale",
                          "0.05"], signal.SIGINT, 1.5, jp)
            check_interrupted("trace SIGINT", rc, out, err, jp, "SIGINT", 130, requests,
                              lambda j: j["requests"]["planned"])
            # Sessions (create, prefill, decode, release), SIGTERM; the KV cache is released.
            for api in ("extend", "stream", "batch"):
                rc, out, err, _ = interrupted_run(
                    loadgen, [*base, "--workload", "session", "--fixed-tokens", "32",
                              "--max-gen", "8", "--requests", "100000", "--decode-api", api,
                              "--check-kv-released"], signal.SIGTERM, 1.5, jp)
                j = check_interrupted(f"session {api} SIGTERM", rc, out, err, jp, "SIGTERM", 143,
                                      lambda j: j["completed"], lambda j: j["planned"])
                assert j["kv_pages_used_after"] == 0, j
            # Mooncake replay (forked prefixes, an LRU of live sequences released at the end).
            rc, out, err, _ = interrupted_run(
                loadgen, [*base, "--workload", "mooncake", "--token-scale", "0.01", "--max-gen",
                          "4", "--requests", "100000", "--check-kv-released"], signal.SIGINT, 2.0,
                jp)
            j = check_interrupted("mooncake SIGINT", rc, out, err, jp, "SIGINT", 130,
                                  lambda j: j["completed"], lambda j: j["planned"])
            assert j["kv_pages_used_after"] == 0, j
            # Rate warning: 1000/s offered, one call at a time (256 tokens, 8 heads: several ms
            # each on any CPU).
            slow = subprocess.run(
                [loadgen, *plain, "--workload", "fixed", "--fixed-tokens", "256", "--heads", "8",
                 "--kv-heads", "8", "--head-dim", "64", "--mode", "open", "--rate", "1000",
                 "--requests", "30", "--max-in-flight", "1", "--quiet", "--json", jp],
                capture_output=True, text=True, timeout=120)
            assert slow.returncode == 0, slow
            assert "warning: offered 1000.0/s, achieved" in slow.stderr, slow.stderr
            assert "could not keep up" in slow.stdout, slow.stdout
            with open(jp) as f:
                warnings = json.load(f)["warnings"]
            assert len(warnings) == 1 and "offered 1000.0/s" in warnings[0], warnings
            print("rate warning:", warnings[0])
            easy = subprocess.run(
                [loadgen, *base, "--workload", "fixed", "--fixed-tokens", "8", "--mode", "open",
                 "--rate", "20", "--requests", "30", "--quiet", "--json", jp],
                capture_output=True, text=True, timeout=60)
            assert easy.returncode == 0, easy
            assert "warning" not in easy.stderr, easy.stderr
            with open(jp) as f:
                assert json.load(f)["warnings"] == []

            # Sweep with a backend the server does not have: exit 2, named, nothing measured.
            sweep = subprocess.run(
                [loadgen, "sweep", "--target", target, "--backends", "cpu,nosuch", "--sweep",
                 "seq", "--seq", "16", "--quiet", "--out", os.path.join(d, "sweep")],
                capture_output=True, text=True, timeout=60)
            assert sweep.returncode == 2, sweep
            assert "backend 'nosuch' is not on the server; available: cpu" in sweep.stderr, \
                sweep.stderr
            assert not os.path.exists(os.path.join(d, "sweep", "sweep-seq.csv"))
            print("sweep:", sweep.stderr.strip())
            # Sweep interrupted: the (point, backend) runs done so far are written, exit 130.
            out_dir = os.path.join(d, "sweep-int")
            sw = subprocess.Popen(
                [loadgen, "sweep", "--target", target, "--backends", "cpu", "--sweep", "seq",
                 "--seq", "16,32,48,64,96,128,160,192,1024,2048,3072,4096", "--heads", "4",
                 "--kv-heads", "4", "--head-dim", "32", "--requests", "3", "--plot", "off",
                 "--quiet", "--out", out_dir], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True)
            time.sleep(2.5)
            assert sw.poll() is None, sw.communicate()
            sw.send_signal(signal.SIGINT)
            out, err = sw.communicate(timeout=30)
            assert sw.returncode == 130, (sw.returncode, out, err)
            assert "INTERRUPTED by SIGINT" in out, out
            with open(os.path.join(out_dir, "sweep-seq.csv")) as f:
                rows = f.read().splitlines()[1:]
            assert 1 <= len(rows) < 12, rows
            assert all(r.split(",")[10] == "3" for r in rows), rows  # every written point whole
            print(f"sweep SIGINT: exit 130, {len(rows)} of 12 points written")
            # A call in flight past the grace period is cancelled: exit within 2 s + slack. One
            # call of 6144 tokens takes ~6 s on two cores (bf16 keeps the request at 19 MB).
            big = ["--target", target, "--backend", "cpu", "--dtype", "bf16", "--workload",
                   "fixed", "--fixed-tokens", "6144", "--requests", "1000"]
            rc, out, err, took = interrupted_run(loadgen, big, signal.SIGINT, 1.0, jp)
            assert rc == 130, (rc, out, err)
            assert took < 6, f"exit {took:.1f} s after SIGINT (grace is 2 s)"
            with open(jp) as f:
                j = json.load(f)
            assert j["interrupted"] is True, j
            assert j["errors"].get("CANCELLED", {}).get("count", 0) >= 1, j["errors"]
            print(f"grace: exit {took:.2f} s after SIGINT, in-flight call CANCELLED")
            # A second signal exits at once, with no report.
            os.remove(jp)
            rc, out, err, took = interrupted_run(loadgen, big, signal.SIGINT, 1.0, jp,
                                                 second_after_s=0.2)
            assert rc == 130, (rc, out, err)
            assert took < 1.5, f"second SIGINT: exit {took:.1f} s after the first"
            assert "second signal" in err, err
            assert not os.path.exists(jp)
            print(f"second signal: exit {took:.2f} s after the first")
            print("PASS")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
