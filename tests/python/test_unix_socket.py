"""`--listen unix:PATH` (server/common/unix_socket.h) with the Python client and the loadgen:
socket mode (default 0660, --unix-socket-mode), group (--unix-socket-group), health, bearer
tokens, a stale socket replaced, a live socket / non-socket path / bad flags refused, the file
removed at a clean stop.
Run: ATTN_SERVER_BIN=build/server/attention-server ATTN_LOADGEN_BIN=build/client/attention-loadgen
     PYTHONPATH=client/python python3 -m pytest -q tests/python/test_unix_socket.py
"""
import json
import os
import socket
import stat
import subprocess
import sys

import grpc
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import attention_client as ac  # noqa: E402
from live_server import SERVER, LiveServer  # noqa: E402

LOADGEN = os.environ.get("ATTN_LOADGEN_BIN", "build/client/attention-loadgen")
TOKEN = "unix-token-0123456789abcdef"


def health(target):
    """grpc.health.v1 Check of "" over `target` with raw bytes → the status byte or code name."""
    with grpc.insecure_channel(target) as ch:
        check = ch.unary_unary("/grpc.health.v1.Health/Check")
        try:
            return {b"\x08\x01": "SERVING", b"\x08\x02": "NOT_SERVING"}.get(
                check(b"", timeout=10), "OTHER")
        except grpc.RpcError as e:
            return e.code().name


def run_server(*args, timeout=30):
    """Runs the server expected to refuse start-up → (exit status, output)."""
    p = subprocess.run([SERVER, "--metrics-address", "", "--log-level", "info", *args],
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def test_serves_health_mode_and_removes_socket(tmp_path):
    with LiveServer("unix", tmp_path) as s:
        st = os.stat(s.socket_path)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660
        assert s.target == f"unix:{s.socket_path}"
        assert health(s.target) == "SERVING"
        with ac.AttentionClient(s.target) as c:
            assert c.load().worker_threads >= 1
            q = np.ones((1, 1, 2, 8), np.float32)
            np.testing.assert_allclose(c.attend(q, q, q).o, 1.0, rtol=1e-6)
        assert s.stop() == 0
        assert not os.path.exists(s.socket_path)


def test_mode_and_group_flags(tmp_path):
    gid = os.getgid()
    with LiveServer("unix", tmp_path, "--unix-socket-mode", "0600", "--unix-socket-group",
                    str(gid)) as s:
        st = os.stat(s.socket_path)
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_gid == gid
        assert health(s.target) == "SERVING"


@pytest.mark.parametrize("mode", ["0999", "rw", "01777", ""])
def test_bad_mode_refused(tmp_path, mode):
    rc, out = run_server("--listen", f"unix:{tmp_path}/s.sock", "--unix-socket-mode", mode)
    assert rc == 2 and "--unix-socket-mode" in out, out
    assert not os.path.exists(tmp_path / "s.sock")


def test_socket_flags_refused_with_tcp(tmp_path):
    rc, out = run_server("--listen", "127.0.0.1:0", "--unix-socket-mode", "0600")
    assert rc == 2 and "only to --listen unix:PATH" in out, out


def test_unknown_group_refused(tmp_path):
    rc, out = run_server("--listen", f"unix:{tmp_path}/s.sock", "--unix-socket-group",
                         "no-such-group-attn")
    assert rc == 2 and "no such group" in out, out
    assert not os.path.exists(tmp_path / "s.sock")


def test_stale_socket_replaced_live_refused(tmp_path):
    path = str(tmp_path / "attn.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()  # the file stays, nobody listens: what a crashed server leaves
    assert stat.S_ISSOCK(os.stat(path).st_mode)
    with LiveServer("unix", tmp_path) as s:
        assert "removed a stale socket file" in s.log()
        assert health(s.target) == "SERVING"
        rc, out = run_server("--listen", s.target)
        assert rc == 1 and "another server is listening" in out, out
        assert health(s.target) == "SERVING"  # the live server keeps its socket


def test_non_socket_path_refused(tmp_path):
    path = tmp_path / "file"
    path.write_text("keep me")
    rc, out = run_server("--listen", f"unix:{path}")
    assert rc == 2 and "is not a socket" in out, out
    assert path.read_text() == "keep me"
    rc, out = run_server("--listen", f"unix:{tmp_path}/missing/s.sock")
    assert rc == 2 and "does not exist" in out, out


def test_token_auth(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {TOKEN}\n")
    with LiveServer("unix", tmp_path, "--auth-token-file", str(tokens)) as s:
        with ac.AttentionClient(s.target) as c:
            with pytest.raises(ac.Unauthenticated):
                c.load()
        with ac.AttentionClient(s.target, token="wrong-token-0123456789") as c:
            with pytest.raises(ac.Unauthenticated):
                c.load()
        with ac.AttentionClient(s.target, token=TOKEN) as c:
            with c.create_sequence(1, 2, 1, 8, dtype="float16") as seq:
                r = seq.extend(0, None, *[np.ones((1, n, 8), np.float16) for n in (2, 1, 1)])
                assert r.length == 1
        assert health(s.target) == "SERVING"  # health needs no token, as on TCP


@pytest.mark.skipif(not os.path.exists(LOADGEN), reason="attention-loadgen not built")
def test_loadgen_over_unix_socket(tmp_path):
    with LiveServer("unix", tmp_path) as s:
        out = tmp_path / "lg.json"
        p = subprocess.run([LOADGEN, "--target", s.target, "--workload", "session",
                            "--decode-api", "batch", "--layers", "2", "--heads", "4",
                            "--kv-heads", "2", "--head-dim", "16", "--requests", "4",
                            "--concurrency", "2", "--dtype", "bf16", "--token-scale", "0.02",
                            "--max-gen", "3", "--verify-fraction", "1", "--quiet",
                            "--check-kv-released", "--fail-on-error", "--json", str(out)],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        j = json.loads(out.read_text())
        assert j["target"] == s.target
        assert j["sessions_ok"] == 4 and not j["errors"] and j["mismatches"] == 0, j
        assert j["verified"] > 0 and j["kv_pages_used_after"] == 0, j
