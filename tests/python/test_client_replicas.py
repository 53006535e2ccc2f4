"""ReplicaSet (client/python/attention_client/replicas.py) against two real attention-server
processes on loopback standing for two replicas (DESIGN.md §12): stateless calls round-robin
over both, sequences stay on the replica that created them (routed by the id's replica tag),
and a draining replica gets no new work while its live sequence is still served to the end.

Run: ATTN_SERVER_BIN=build/server/attention-server PYTHONPATH=client/python \
     python3 -m pytest -q tests/python/test_client_replicas.py
"""
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import attention_client as ac  # noqa: E402
from attention_client import AttentionClient, ReplicaSet  # noqa: E402
from attention_client.replicas import resolve  # noqa: E402

SERVER = os.environ.get("ATTN_SERVER_BIN", "build/server/attention-server")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One attention-server on loopback with a known gRPC port, metrics port and log."""

    def __init__(self, *extra):
        self.port, self.metrics_port = free_port(), free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.dir = tempfile.mkdtemp()
        self.log = os.path.join(self.dir, "server.log")
        port_file = os.path.join(self.dir, "port")
        self.proc = subprocess.Popen(
            [SERVER, "--listen", self.address, "--port-file", port_file,
             "--advertise-address", self.address, "--default-backend", "cpu",
             "--metrics-address", f"127.0.0.1:{self.metrics_port}", "--log-level", "info",
             *extra], stderr=open(self.log, "w"))
        for _ in range(300):
            if os.path.exists(port_file) and open(port_file).read().strip():
                return
            assert self.proc.poll() is None, open(self.log).read()
            time.sleep(0.05)
        raise AssertionError("server did not start: " + open(self.log).read())

    def attend_calls(self):
        """Attend calls this server completed with OK (attn_requests_total)."""
        text = urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
        return sum(float(m.group(1)) for m in re.finditer(
            r'^attn_requests_total\{(?=[^}]*method="Attend")(?=[^}]*code="OK")[^}]*\} (\S+)$', text, re.M))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def servers():
    s = [Server("--drain-wait-sequences", "--drain-timeout-s", "30") for _ in range(2)]
    yield s
    for x in s:
        x.stop()


def oracle(q, k, v):
    """(B,T,N,H) attention without mask in float64, K == N."""
    s = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", p, v)


def test_resolve_expands_a_name_to_its_addresses():
    assert resolve("localhost:1234")[0] in ("127.0.0.1:1234", "[::1]:1234")
    assert resolve(["127.0.0.2:5", "127.0.0.1:6", "127.0.0.2:5"]) == ["127.0.0.1:6",
                                                                        "127.0.0.2:5"]
    with pytest.raises(ValueError):
        resolve("no-port")


def test_attend_round_robins_and_sequences_stay_on_their_replica(servers):
    a, b = servers
    rng = np.random.default_rng(0)
    with ReplicaSet([a.address, b.address], timeout=30) as rs:
        assert rs.addresses == sorted([a.address, b.address])
        for _ in range(6):
            q, k, v = (rng.standard_normal((1, 3, 2, 8)).astype(np.float32) for _ in range(3))
            out = rs.attend(q, k, v)
            np.testing.assert_allclose(out.o, oracle(q, k, v), atol=1e-5)
        assert a.attend_calls() == 3 and b.attend_calls() == 3

        tags = {AttentionClient(x.address).server_info().replica.replica_tag: x.address
                for x in servers}
        seqs = [rs.create_sequence(1, 2, 2, 8) for _ in range(4)]
        homes = {tags[s.id[:8]] for s in seqs}
        assert homes == {a.address, b.address}, "round-robin creation uses both replicas"
        for s in seqs:
            assert s.info.replica_address == tags[s.id[:8]]
            for pos in range(3):
                step = [rng.standard_normal((1, 2, 8)).astype(np.float32) for _ in range(3)]
                assert s.extend(0, pos, *step).length == pos + 1
            # A fresh handle from the id alone reaches the same replica.
            assert rs.sequence(s.id).layer_lengths == [3]
        # ExtendBatch across replicas: one call per replica, results in order.
        steps = [(s, 0, 3, *[rng.standard_normal((1, 2, 8)).astype(np.float32)
                             for _ in range(3)]) for s in seqs]
        results = rs.extend_batch(steps)
        assert [r.length for r in results] == [4, 4, 4, 4]
        # The other replica does not know the sequence: NotFound naming the tags.
        other = b.address if tags[seqs[0].id[:8]] == a.address else a.address
        with AttentionClient(other) as c, pytest.raises(ac.NotFound, match="replica tag"):
            c.sequence(seqs[0].id)
        with pytest.raises(ac.NotFound):
            rs.sequence("ffffffff" + "0" * 24)
        for s in seqs:
            s.release()


def test_draining_replica_gets_no_new_work_and_finishes_its_sequence(servers):
    a, b = servers
    rng = np.random.default_rng(1)
    with ReplicaSet([a.address, b.address], timeout=30) as rs:
        live = None
        while live is None:  # a sequence on replica a
            s = rs.create_sequence(1, 2, 2, 8)
            if s.info.replica_address == a.address:
                live = s
            else:
                s.release()
        a.proc.send_signal(signal.SIGTERM)
        with AttentionClient(a.address) as direct:
            for _ in range(100):
                if direct.load().draining:
                    break
                time.sleep(0.05)
            assert direct.load().draining
        before = a.attend_calls()
        for _ in range(4):  # every new sequence and stateless call lands on b
            s = rs.create_sequence(1, 2, 2, 8)
            assert s.info.replica_address == b.address
            s.release()
            q, k, v = (rng.standard_normal((1, 2, 2, 8)).astype(np.float32) for _ in range(3))
            rs.attend(q, k, v)
        assert a.attend_calls() == before
        # The live sequence on the draining replica is still served...
        for pos in range(5):
            step = [rng.standard_normal((1, 2, 8)).astype(np.float32) for _ in range(3)]
            assert live.extend(0, pos, *step).length == pos + 1
        assert a.proc.poll() is None
        live.release()  # ...and releasing it ends the drain.
        assert a.proc.wait(timeout=20) == 0
        assert "stopped cleanly" in open(a.log).read()
