"""Connection age (issue 19 item 4): the server's --max-connection-age-s sends GOAWAY to every
connection once it is that old, so long-lived clients reconnect and re-resolve (pods a headless
Service gained since get calls). Against the real server binary on loopback, each test bounded
to a few seconds:

1. Unary calls (Attend; Extend on a sequence) from one AttentionClient (round_robin) keep
   succeeding across several ages: no error reaches the caller, and the client opened new
   TCP connections (seen in /proc/net/tcp: several local ports towards the server's port).
2. An ExtendStream still open when the grace period after the GOAWAY ends is closed with
   UNAVAILABLE (the client has no automatic retry). What the caller does, and this test does:
   open a new stream, take the layer's length from GetSequence, and resend the step that
   failed at its position — the position/replay rule makes that safe: applied once (replayed
   when the first attempt had landed), and its output equals a control sequence's.
3. AttentionClient's load_balancing: round_robin and pick_first both serve; others refused.

Run: ATTN_SERVER_BIN=build/server/attention-server python3 -m pytest tests/integration/test_connection_age.py
"""
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from server_proc import ServerProc  # noqa: E402  (also puts client/python on sys.path)
from attention_client import AttentionClient  # noqa: E402
from attention_client.errors import Unavailable  # noqa: E402

AGE_S = 1.0


def client_ports(server_port):
    """Local ports of this host's ESTABLISHED TCP connections to 127.0.0.1:server_port, i.e.
    the client side of every connection to the server (its own side has the server port as
    local port). Read from /proc/net/tcp and tcp6 (gRPC's sockets are dual-stack: 127.0.0.1
    shows as ::ffff:127.0.0.1 there; hex addresses; state 01 = ESTABLISHED)."""
    ports = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(path) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                local, remote, state = fields[1], fields[2], fields[3]
                if state == "01" and int(remote.rsplit(":", 1)[1], 16) == server_port:
                    ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def step(rng, t=1, n=2, h=8):
    """One decode step's (q, k, v), float32, shapes (T, N, H) with K = N."""
    return tuple(rng.standard_normal((t, n, h)).astype(np.float32) for _ in range(3))


def test_unary_calls_succeed_across_connection_age_and_reconnect():
    with ServerProc("--threads", "2", "--max-connection-age-s", str(AGE_S),
                    "--max-connection-age-grace-s", "1") as server:
        rng = np.random.default_rng(1)
        x = rng.standard_normal((1, 8, 2, 8)).astype(np.float32)
        seen = set()
        calls = 0
        with AttentionClient(server.target, timeout=10) as c:
            seq = c.create_sequence(1, 2, 2, 8)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 4 * AGE_S:  # ~4 ages, ±10 % jitter each
                r = c.attend(x, x, x)  # raises on any error
                assert r.o.shape == x.shape
                e = seq.extend(0, None, *step(rng))
                assert not e.replayed
                calls += 1
                seen |= client_ports(server.port)
                time.sleep(0.02)
            assert seq.refresh().layer_lengths[0] == calls  # every step applied once
            seq.release()
        assert calls >= 20, calls
        # Connections were replaced after their age: several client-side ports were used (one
        # per ~second; the ServerProc's own idle channel never connects).
        assert len(seen) >= 3, f"connections for {4 * AGE_S} s: ports {seen}"
        assert server.alive()


def test_stream_past_grace_gets_unavailable_and_a_resent_step_is_safe():
    with ServerProc("--threads", "2", "--max-connection-age-s", str(AGE_S),
                    "--max-connection-age-grace-s", "1") as server:
        rng = np.random.default_rng(2)
        steps = [step(rng) for _ in range(200)]
        with AttentionClient(server.target, timeout=30) as c:
            seq = c.create_sequence(1, 2, 2, 8)
            failed_at, error = None, None
            t0 = time.monotonic()
            st = c.extend_stream(max_in_flight=1)
            for i, (q, k, v) in enumerate(steps):
                try:
                    st.extend(seq, 0, i, q, k, v, timeout=10)
                except Unavailable as e:
                    failed_at, error = i, e
                    break
                time.sleep(0.03)
            elapsed = time.monotonic() - t0
            st.close(timeout=5)
            assert failed_at is not None, "the stream outlived age + grace"
            # GOAWAY after 0.9-1.1 s, then 1 s of grace (plus the server's timer granularity).
            assert 1.5 < elapsed < 5.0, (elapsed, error)
            # Resume: the server's length says whether the failed step landed.
            length = seq.refresh().layer_lengths[0]
            assert length in (failed_at, failed_at + 1), (length, failed_at)
            with c.extend_stream(max_in_flight=1) as st2:
                q, k, v = steps[failed_at]
                r = st2.extend(seq, 0, failed_at, q, k, v, timeout=10)
                assert r.replayed == (length == failed_at + 1)
                assert r.length == failed_at + 1
                nxt = st2.extend(seq, 0, None, *steps[failed_at + 1], timeout=10)
                assert nxt.length == failed_at + 2
            # The resent step's output is the one a sequence fed once gets (nothing doubled).
            control = c.create_sequence(1, 2, 2, 8)
            for j in range(failed_at + 1):
                want = control.extend(0, j, *steps[j])
            np.testing.assert_allclose(r.o, want.o, rtol=1e-6, atol=1e-6)
            seq.release()
            control.release()
        assert server.alive()


def test_load_balancing_policy_is_checked():
    # Both policies serve a single-server target; anything else is refused before any call.
    with ServerProc("--threads", "2") as server:
        x = np.ones((1, 4, 1, 8), np.float32)
        for policy in ("round_robin", "pick_first"):
            with AttentionClient(server.target, timeout=10, load_balancing=policy) as c:
                assert c.attend(x, x, x).o.shape == x.shape
    try:
        AttentionClient("127.0.0.1:1", load_balancing="grpclb")
        raise AssertionError("an unknown policy was accepted")
    except ValueError as e:
        assert "round_robin" in str(e)
