"""Integration: the real attention-server's /metrics under a few calls.

One server (cpu backend, --shadow-check-fraction 1, metrics on a free port) gets 12 Attend
calls from attention-loadgen, one invalid Attend and one GetServerInfo (raw gRPC); then:
- `promtool check metrics` accepts the live scrape (format and lint);
- the counters match what was sent, per method/backend/code, and the histograms' _count too;
- every call is shadow-checked (attn_shadow_relative_error{backend="cpu"}) or counted as
  dropped, with no mismatch;
- every metric the Grafana dashboard's PromQL uses exists in the scrape;
- the server still stops cleanly (exit 0) on SIGTERM.
Run: python3 -m pytest tests/integration/test_metrics_live.py (env: ATTN_SERVER_BIN,
ATTN_LOADGEN_BIN, PROMTOOL).
"""
import json
import os
import subprocess
import time

import grpc
import pytest

import metrics_testlib as lib

CALLS = 12
SESSIONS = 2
DASHBOARD = os.path.join(lib.ROOT, "deploy", "grafana", "attention-server.json")
# Families exported only once a component registers (the KV cache): HELP/TYPE without samples.
OPTIONAL_SAMPLES = {"attn_kv_capacity_pages", "attn_kv_used_pages", "attn_kv_sequences",
                    "attn_kv_host_used_bytes", "attn_kv_host_capacity_bytes"}


def _identity(x):
    return x


@pytest.fixture(scope="module")
def served():
    server = lib.Server("--default-backend", "cpu", "--shadow-check-fraction", "1",
                        "--threads", "2", "--cpu-threads", "1")
    try:
        report = lib.run_loadgen(server.target, "--workload", "fixed", "--fixed-tokens", "48",
                                 "--requests", str(CALLS), "--concurrency", "2",
                                 "--fail-on-error")
        # SequenceService calls are counted too (backend="none"): two generation sessions.
        lib.run_loadgen(server.target, "--workload", "session", "--decode-api", "stream",
                        "--requests", str(SESSIONS), "--concurrency", "1", "--layers", "1",
                        "--heads", "2", "--kv-heads", "2", "--head-dim", "16", "--dtype", "fp32",
                        "--fixed-tokens", "8", "--max-gen", "3", "--fail-on-error")
        with grpc.insecure_channel(server.target) as ch:
            attend = ch.unary_unary("/attention.v1.AttentionService/Attend",
                                    request_serializer=_identity,
                                    response_deserializer=_identity)
            with pytest.raises(grpc.RpcError) as err:
                attend(b"", timeout=10)  # empty request: INVALID_ARGUMENT
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            info = ch.unary_unary("/attention.v1.AttentionService/GetServerInfo",
                                  request_serializer=_identity,
                                  response_deserializer=_identity)
            assert info(b"", timeout=10)
        # Shadow checks run off the hot path: wait until all are recorded.
        deadline = time.time() + 30
        while time.time() < deadline:
            samples, _ = lib.parse(server.scrape())
            done = (lib.value(samples, "attn_shadow_relative_error_count", backend="cpu") +
                    lib.value(samples, "attn_shadow_dropped_total", backend="cpu"))
            if done >= CALLS:
                break
            time.sleep(0.1)
        yield server, report
    finally:
        code = server.close()
    assert code == 0


def test_promtool_check_metrics_passes_on_live_scrape(served):
    server, _ = served
    text = server.scrape()
    out = subprocess.run([lib.PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "attn_request_duration_seconds_bucket" in text


def test_counts_match_what_was_sent(served):
    server, report = served
    assert report["requests"]["ok"] == CALLS
    samples, types = lib.parse(server.scrape())
    v = lambda name, **l: lib.value(samples, name, **l)  # noqa: E731
    assert v("attn_requests_total", method="Attend", backend="cpu", code="OK") == CALLS
    assert v("attn_request_duration_seconds_count", method="Attend", backend="cpu",
             code="OK") == CALLS
    assert v("attn_requests_total", method="Attend", backend="none",
             code="INVALID_ARGUMENT") == 1
    assert v("attn_requests_total", method="GetServerInfo", code="OK") == 1
    for method in ("CreateSequence", "ReleaseSequence"):
        assert v("attn_requests_total", method=method, backend="none", code="OK") == SESSIONS
    assert v("attn_requests_total", method="Extend", backend="none", code="OK") >= SESSIONS
    assert v("attn_requests_total", method="ExtendStream", backend="none", code="OK") >= 1
    assert v("attn_request_duration_seconds_count", method="CreateSequence", backend="none",
             code="OK") == SESSIONS
    # Attend calls under their backend (cpu), the sequence steps that ran under the paged
    # backend that ran them (paged-cpu; no encode phase).
    steps = v("attn_sequence_steps_total", result="ok")
    assert steps >= SESSIONS
    for phase in ("decode", "queue", "host_to_device", "kernel", "device_to_host"):
        assert v("attn_phase_duration_seconds_count", backend="cpu", phase=phase) == CALLS
        assert v("attn_phase_duration_seconds_count", backend="paged-cpu", phase=phase) == steps
    assert v("attn_phase_duration_seconds_count", backend="cpu", phase="encode") == CALLS
    # One observation per launch; concurrent calls may share a launch (dynamic batching), so
    # launches <= calls while the requests and tokens summed over launches are exact.
    for backend, n in (("cpu", CALLS), ("paged-cpu", steps)):
        assert 1 <= v("attn_batch_size_requests_count", backend=backend) <= n
        assert v("attn_batch_size_requests_sum", backend=backend) == n
    assert v("attn_batch_tokens_sum", backend="cpu") >= CALLS * 48
    assert v("attn_batch_tokens_sum", backend="paged-cpu") >= steps
    assert v("attn_kernel_flops_per_second_count", backend="cpu") > 0
    assert v("attn_requests_in_flight") == 0
    assert v("attn_requests_queued") == 0
    # The pool ServerFacts reports (the device pool; without a GPU whatever main.cc puts there).
    assert v("attn_device_pool_capacity_bytes") >= v("attn_device_pool_used_bytes") >= 0
    for family in ("attn_graph_cache_hits_total", "attn_graph_cache_builds_total"):
        assert [s for s in samples if s[0] == family], family  # present, 0 until cuDNN
    info = [l for n, l, _ in samples if n == "attn_build_info"]
    assert len(info) == 1
    assert info[0]["device"] == "cpu" and info[0]["default_backend"] == "cpu"
    assert info[0]["shadow_check_fraction"] == "1"
    for key in ("version", "build", "driver", "cudnn", "backends", "compute_capability"):
        assert key in info[0]
    # Conventions on the live scrape: counters end in _total, no summaries among attn_*.
    for name, kind in types.items():
        if name.startswith("attn_"):
            assert kind != "summary", name
            assert (kind == "counter") == name.endswith("_total"), name


def test_shadow_histogram_populated(served):
    server, _ = served
    samples, _ = lib.parse(server.scrape())
    checked = lib.value(samples, "attn_shadow_relative_error_count", backend="cpu")
    dropped = lib.value(samples, "attn_shadow_dropped_total", backend="cpu")
    # Fraction 1: every call is sampled; each is checked or, when the bounded queue is full,
    # dropped and counted. The first one always finds the queue empty.
    assert checked + dropped == CALLS
    assert checked >= 1
    assert lib.value(samples, "attn_shadow_mismatches_total", backend="cpu") == 0
    # bf16 output against the float64 reference: rounding error only, well under 1e-2.
    assert lib.value(samples, "attn_shadow_relative_error_bucket", backend="cpu",
                     le="0.01") == checked
    assert lib.value(samples, "attn_shadow_relative_error_sum", backend="cpu") < 1e-2 * checked


def test_dashboard_metrics_exist_in_live_scrape(served):
    server, _ = served
    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    exprs = lib.dashboard_exprs(dashboard)
    assert len(exprs) >= 15, "the dashboard has fewer queries than expected"
    names = set()
    for e in exprs:
        names |= lib.promql_metric_names(e)
    assert len(names) >= 15, names
    text = server.scrape()
    samples, types = lib.parse(text)
    sample_names = {n for n, _, _ in samples}
    missing = []
    for name in sorted(names):
        if name in sample_names:
            continue
        if name in OPTIONAL_SAMPLES and name in types:
            continue
        missing.append(name)
    assert not missing, f"dashboard uses metrics the server does not export: {missing}"


def test_promql_name_extraction():
    f = lib.promql_metric_names
    assert f('histogram_quantile(0.99, sum by (le, backend) '
             '(rate(attn_request_duration_seconds_bucket{code="OK",backend=~"$backend"}'
             '[$__rate_interval])))') == {"attn_request_duration_seconds_bucket"}
    assert f("sum(attn_kv_used_pages) / sum without (layout_class) (attn_kv_capacity_pages)"
             ) == {"attn_kv_used_pages", "attn_kv_capacity_pages"}
    assert f("max(attn_device_peak_flops_per_second) * 1e-12 > bool 0") == {
        "attn_device_peak_flops_per_second"}
    assert f("a_total offset 5m + on(x) group_left(y) b") == {"a_total", "b"}


def test_idle_connections_do_not_stall_scrapes(served):
    """Clients that connect and send nothing (probes, slowloris) must not delay a scrape."""
    import socket
    import urllib.request
    server, _ = served
    host, port = server.metrics_target.split(":")
    idle = [socket.create_connection((host, int(port))) for _ in range(8)]
    try:
        start = time.time()
        with urllib.request.urlopen(f"http://{server.metrics_target}/metrics", timeout=3) as r:
            assert r.status == 200
            assert b"attn_requests_total" in r.read()
        assert time.time() - start < 1.0
    finally:
        for s in idle:
            s.close()
