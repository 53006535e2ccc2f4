"""Integration: the SequenceService metrics on a live scrape of the real attention-server (cpu).

A short session (Python client): 3 Extend calls, one ExtendBatch of 2 entries, one ExtendStream
of 3 messages. Asserts attn_sequence_steps_total / attn_sequence_step_duration_seconds moved by
exactly those counts per method (a stream per step, and once in attn_requests_total when it
ends), that the step batches reached attn_sequence_batch_size_steps and the cpu batch/phase
histograms, and that attn_kv_used_ratio sees the live sequences. Then, when Prometheus is
installed, every query of the dashboard's SequenceService row and batch panels returns data
from a Prometheus scraping the server during such a session (else: their metric names are in
the scrape).
Run: ATTN_SERVER_BIN=... PYTHONPATH=client/python python3 -m pytest tests/integration/test_metrics_sequences.py
"""
import json
import os
import shutil
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import metrics_testlib as lib  # noqa: E402
from attention_client import AttentionClient  # noqa: E402

N, K, H = 2, 2, 8
DASHBOARD = os.path.join(lib.ROOT, "deploy", "grafana", "attention-server.json")
# Panels whose queries must return data during a session (titles in the dashboard).
SESSION_PANELS = ("Decode step latency p50 / p99", "Steps/s", "KV usage",
                  "Sequence batch size (steps per batch)", "Batch size (requests per launch)")


def _step(rng):
    return tuple(rng.standard_normal((1, n, H)).astype(np.float32) for n in (N, K, K))


def session(client, rng):
    """3 Extend, 1 ExtendBatch of 2, 1 ExtendStream of 3; returns the live sequences."""
    a = client.create_sequence(1, N, K, H)
    b = client.create_sequence(1, N, K, H)
    for pos in range(3):
        a.extend(0, pos, *_step(rng))
    results = client.extend_batch([(a, 0, 3) + _step(rng), (b, 0, 0) + _step(rng)])
    assert not any(isinstance(r, Exception) for r in results), results
    with client.extend_stream(timeout=30) as s:
        for pos in range(1, 4):
            s.extend(b, 0, pos, *_step(rng), timeout=30)
    return a, b


def _value(samples, name, **labels):
    v = lib.value(samples, name, **labels)
    return 0.0 if v is None else v


@pytest.fixture(scope="module")
def server():
    s = lib.Server("--default-backend", "cpu", "--threads", "2")
    try:
        yield s
    finally:
        assert s.close() == 0


def test_step_series_move_by_the_session_counts(server):
    before, _ = lib.parse(server.scrape())
    with AttentionClient(server.target) as c:
        a, b = session(c, np.random.default_rng(1))
        live, _ = lib.parse(server.scrape())
        # The bytes of the pages in use over the whole pool: a and b hold one 16-token page
        # each (4 tokens of one layer), K and V of 16 x K x H float32 -- not pages over the
        # pages carved so far (that read 1.0 with the pool nearly empty).
        pool = c.load(timeout=10).kv_pool_bytes
        page = 16 * K * H * 4
        assert _value(live, "attn_kv_used_ratio") == pytest.approx(2 * 2 * page / pool,
                                                                   rel=1e-9)
        a.release()
        b.release()
    after, _ = lib.parse(server.scrape())

    def delta(name, **labels):
        return _value(after, name, **labels) - _value(before, name, **labels)

    for method, n in (("Extend", 3), ("ExtendBatch", 2), ("ExtendStream", 3)):
        assert delta("attn_sequence_steps_total", method=method, result="ok") == n, method
        assert delta("attn_sequence_steps_total", method=method, result="error") == 0, method
        assert delta("attn_sequence_step_duration_seconds_count", method=method) == n, method
        assert delta("attn_sequence_step_duration_seconds_sum", method=method) > 0, method
        # Every step of the session is one query token: each is a decode step too.
        assert delta("attn_sequence_decode_step_duration_seconds_count", method=method) == n, method
    assert delta("attn_requests_total", method="ExtendStream", backend="none", code="OK") == 1
    assert delta("attn_sequence_batch_size_steps_sum") == 8
    assert 1 <= delta("attn_sequence_batch_size_steps_count") <= 8
    assert delta("attn_batch_size_requests_sum", backend="paged-cpu") == 8
    assert delta("attn_batch_tokens_sum", backend="paged-cpu") == 8
    assert delta("attn_phase_duration_seconds_count", backend="paged-cpu", phase="kernel") == 8
    assert delta("attn_phase_duration_seconds_count", backend="paged-cpu", phase="queue") == 8


def _session_exprs():
    with open(DASHBOARD) as f:
        panels = json.load(f)["panels"]
    exprs = [t["expr"] for p in panels if p.get("title") in SESSION_PANELS
             for t in p.get("targets", [])]
    assert len(exprs) >= 7, exprs
    return exprs


def test_dashboard_session_panels_return_data(server):
    exprs = _session_exprs()
    if shutil.which(lib.PROMETHEUS) is None:
        names = set()
        for e in exprs:
            names |= lib.promql_metric_names(e)
        samples, _ = lib.parse(server.scrape())
        have = {n for n, _, _ in samples}
        assert not names - have, names - have
        pytest.skip("prometheus not installed: checked the metric names only")
    from test_prometheus_scrape import Prometheus  # noqa: E402
    prom = Prometheus(server.metrics_target)
    try:
        rng = np.random.default_rng(2)
        with AttentionClient(server.target) as c:
            seqs = []
            deadline = time.time() + 20
            while time.time() < deadline:  # sessions for at least 4 scrapes (1 s apart)
                seqs += session(c, rng)
                if time.time() > deadline - 14:
                    r = prom.query("count_over_time(attn_sequence_steps_total[1m])")["result"]
                    if r and max(float(x["value"][1]) for x in r) >= 5:
                        break
                time.sleep(0.2)
            empty = []
            for e in exprs:
                q = e.replace("$__rate_interval", "10s").replace("$backend", ".*")
                if not prom.query(q)["result"]:
                    empty.append(q)
            assert not empty, "dashboard queries without data: " + "\n".join(empty) + \
                prom.read_log()
            for s in seqs:
                s.release()
    finally:
        prom.close()
