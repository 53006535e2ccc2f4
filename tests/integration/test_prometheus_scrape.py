"""Integration: a real Prometheus server scrapes attention-server under closed-loop load.

Prometheus (Debian's `prometheus`) runs on a free loopback port with a temporary config
(scrape_interval 1s) and TSDB directory, scraping the server's /metrics; attention-loadgen
runs a fixed workload for LOAD_S seconds (concurrency 2, cpu backend). Then, through
Prometheus's HTTP API:

1. the expected series exist (/api/v1/label/__name__/values) and the target is up;
2. exact totals: the last sample of attn_requests_total{method="Attend",backend="cpu",
   code="OK"} (scraped after the load ended) equals the loadgen's ok count, its first sample
   (before the load) is 0, and sum(attn_request_duration_seconds_count) equals what it sent;
3. rate: rate() over the window between the first and the last scrape that fell strictly
   inside the run (counter strictly between 0 and the total, so the window is fully inside the
   run; at least 4 scrape intervals) matches the loadgen's throughput (ok / wall time) within
   ±5 %. Both window ends are real samples, so rate() does not extrapolate: it is the exact
   slope of the counter between two scrapes;
4. every PromQL expression of the Grafana dashboard evaluates without error.
CI cost: about LOAD_S + 8 s. Registered RUN_SERIAL so no other test competes for the two
cores while the load's throughput is measured.
"""
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

import pytest

import metrics_testlib as lib

LOAD_S = 20
SCRAPE_S = 1.0
SERIES = 'attn_requests_total{method="Attend",backend="cpu",code="OK"}'
EXPECTED_NAMES = [
    "attn_requests_total", "attn_request_duration_seconds_bucket",
    "attn_request_duration_seconds_count", "attn_phase_duration_seconds_bucket",
    "attn_batch_size_requests_bucket", "attn_batch_tokens_bucket",
    "attn_kernel_flops_per_second_bucket", "attn_kernel_bytes_per_second_bucket",
    "attn_requests_in_flight", "attn_requests_queued", "attn_device_pool_capacity_bytes",
    "attn_device_pool_used_bytes", "attn_device_peak_flops_per_second",
    "attn_graph_cache_hits_total", "attn_graph_cache_builds_total",
    "attn_shadow_relative_error_bucket", "attn_shadow_mismatches_total",
    "attn_shadow_dropped_total", "attn_build_info",
]


class Prometheus:
    def __init__(self, target):
        if shutil.which(lib.PROMETHEUS) is None:
            pytest.skip("prometheus is not installed (scripts/bootstrap.sh installs it)")
        self.tmp = tempfile.TemporaryDirectory(prefix="attn-prom-")
        cfg = os.path.join(self.tmp.name, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write(f"""global:
  scrape_interval: {SCRAPE_S:g}s
  scrape_timeout: {int(SCRAPE_S * 900)}ms
  evaluation_interval: {SCRAPE_S:g}s
scrape_configs:
  - job_name: attention
    static_configs:
      - targets: ["{target}"]
""")
        self.port = lib.free_port()
        self.log = open(os.path.join(self.tmp.name, "prometheus.log"), "w")
        self.proc = subprocess.Popen(
            [lib.PROMETHEUS, f"--config.file={cfg}",
             f"--storage.tsdb.path={os.path.join(self.tmp.name, 'data')}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while True:
            assert self.proc.poll() is None, "prometheus exited: " + self.read_log()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready",
                                            timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.time() < deadline, "prometheus not ready: " + self.read_log()
            time.sleep(0.1)

    def read_log(self):
        with open(os.path.join(self.tmp.name, "prometheus.log")) as f:
            return f.read()

    def api(self, path, **params):
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr, at=None):
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self.api("query", **params)

    def raw_samples(self, selector, window_s=600):
        """[(timestamp s, value)] of the one series `selector` matches, oldest first."""
        data = self.query(f"{selector}[{window_s}s]")
        assert data["resultType"] == "matrix" and len(data["result"]) == 1, data
        return [(float(t), float(v)) for t, v in data["result"][0]["values"]]

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        self.tmp.cleanup()


@pytest.fixture(scope="module")
def run():
    server = lib.Server("--default-backend", "cpu", "--threads", "2")
    prom = None
    try:
        prom = Prometheus(server.metrics_target)
        # Wait for a few scrapes of the idle server (the counter exists at 0 from the start).
        deadline = time.time() + 30
        while True:
            r = prom.query(f"count_over_time({SERIES}[1m])")["result"]
            if r and float(r[0]["value"][1]) >= 3:
                break
            assert time.time() < deadline, "no scrapes: " + prom.read_log()
            time.sleep(0.2)
        start = time.time()
        report = lib.run_loadgen(server.target, "--workload", "fixed", "--fixed-tokens", "64",
                                 "--duration", str(LOAD_S), "--concurrency", "2",
                                 "--fail-on-error", timeout=LOAD_S + 60)
        end = time.time()
        # Wait until a scrape has happened after the last request finished.
        deadline = time.time() + 30
        while prom.raw_samples(SERIES)[-1][0] < end + 0.5 * SCRAPE_S:
            assert time.time() < deadline, "no scrape after the load"
            time.sleep(0.2)
        yield server, prom, report, start, end
    finally:
        if prom is not None:
            prom.close()
        code = server.close()
    assert code == 0


def test_series_exist_and_target_up(run):
    _, prom, _, _, _ = run
    names = set(prom.api("label/__name__/values"))
    missing = [n for n in EXPECTED_NAMES if n not in names]
    assert not missing, missing
    up = prom.query('up{job="attention"}')["result"]
    assert up and up[0]["value"][1] == "1"


def test_total_count_matches_loadgen_exactly(run):
    _, prom, report, start, end = run
    samples = prom.raw_samples(SERIES)
    before = [v for t, v in samples if t < start]
    assert before and before[-1] == 0, samples[:5]
    assert samples[-1][0] > end
    assert samples[-1][1] == report["requests"]["ok"], (samples[-1], report["requests"])
    sent = prom.query('sum(attn_request_duration_seconds_count{method="Attend"})')["result"]
    assert float(sent[0]["value"][1]) == report["requests"]["sent"]


def test_rate_matches_loadgen_within_5_percent(run):
    _, prom, report, _, _ = run
    total = report["requests"]["ok"]
    samples = prom.raw_samples(SERIES)
    inside = [(t, v) for t, v in samples if 0 < v < total]
    assert len(inside) >= 5, f"fewer than 4 scrape intervals inside the run: {inside}"
    (t_a, v_a), (t_b, v_b) = inside[0], inside[-1]
    assert t_b - t_a >= 4 * SCRAPE_S
    # Window (t_b - W, t_b] with W 1 ms longer than t_b - t_a: both ends are samples, no
    # extrapolation beyond 1 ms (and the same with left-open or left-closed range selection).
    window_ms = int(round((t_b - t_a) * 1000)) + 1
    r = prom.query(f"rate({SERIES}[{window_ms}ms])", at=t_b)["result"]
    prom_rate = float(r[0]["value"][1])
    slope = (v_b - v_a) / (t_b - t_a)
    assert abs(prom_rate - slope) / slope < 1e-3, (prom_rate, slope)
    loadgen_rate = total / report["wall_s"]
    assert report["throughput"]["requests_per_s"] == pytest.approx(loadgen_rate, rel=1e-6)
    print(f"prometheus rate {prom_rate:.2f}/s over {t_b - t_a:.1f} s "
          f"({len(inside) - 1} scrape intervals); loadgen {loadgen_rate:.2f}/s "
          f"({total} in {report['wall_s']:.2f} s)")
    assert prom_rate == pytest.approx(loadgen_rate, rel=0.05)


def test_dashboard_queries_evaluate(run):
    _, prom, _, _, _ = run
    with open(os.path.join(lib.ROOT, "deploy", "grafana", "attention-server.json")) as f:
        dashboard = json.load(f)
    exprs = lib.dashboard_exprs(dashboard)
    assert exprs
    nonempty = 0
    for e in exprs:
        q = e.replace("$__rate_interval", "5s").replace("$backend", ".*")
        data = prom.query(q)  # asserts status == success (the expression parses and runs)
        nonempty += 1 if data["result"] else 0
    assert nonempty >= len(exprs) // 2, "most dashboard queries return data under load"
