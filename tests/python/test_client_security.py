"""Python client against a server with mutual TLS and bearer tokens (README "Security"):
the TLS + client certificate + token path works, a missing/wrong token raises Unauthenticated-
coded errors, another identity's sequence is NotFound, and a plaintext client cannot connect.
Certificates are throwaway, made with the openssl command line."""
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import attention_client as ac  # noqa: E402
from attention_client import AttentionClient  # noqa: E402

SERVER = os.environ.get("ATTN_SERVER_BIN", "build/server/attention-server")
ALICE, BOB = "alice-token-0123456789abcdef", "bob-token-fedcba9876543210"


def _certs(d):
    def run(*args):
        subprocess.run(args, cwd=d, check=True, capture_output=True)

    def key(name):
        run("openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-out", f"{name}.key")

    key("ca")
    run("openssl", "req", "-x509", "-new", "-key", "ca.key", "-out", "ca.pem", "-days", "1",
        "-subj", "/CN=test-ca")
    for name, san in (("server", "DNS:localhost,IP:127.0.0.1"), ("client", "DNS:client.test")):
        key(name)
        run("openssl", "req", "-new", "-key", f"{name}.key", "-out", f"{name}.csr", "-subj",
            f"/CN={name}")
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write(f"subjectAltName={san}\n")
        run("openssl", "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.pem")
    return {n: os.path.join(d, n) for n in os.listdir(d)}


@pytest.fixture(scope="module")
def server():
    with tempfile.TemporaryDirectory() as tmp:
        files = _certs(tmp)
        tokens = os.path.join(tmp, "tokens")
        with open(tokens, "w") as f:
            f.write(f"# identity token\nalice {ALICE}\nbob {BOB}\n")
        for who, tok in (("alice", ALICE), ("bob", BOB)):
            with open(os.path.join(tmp, who + ".token"), "w") as f:
                f.write(tok + "\n")
        port_file = os.path.join(tmp, "port")
        proc = subprocess.Popen(
            [SERVER, "--listen", "127.0.0.1:0", "--port-file", port_file, "--default-backend",
             "cpu", "--log-level", "warn", "--metrics-address", "", "--tls-cert",
             files["server.pem"], "--tls-key", files["server.key"], "--tls-client-ca",
             files["ca.pem"], "--auth-token-file", tokens],
            stderr=subprocess.PIPE)
        try:
            for _ in range(300):
                if os.path.exists(port_file) and open(port_file).read().strip():
                    break
                assert proc.poll() is None, proc.stderr.read().decode()
                time.sleep(0.1)
            yield f"127.0.0.1:{int(open(port_file).read())}", files, tmp
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0


def _client(server, token_file=None, token=None, **kw):
    target, files, _ = server
    return AttentionClient(target, timeout=10, ca_file=files["ca.pem"],
                           cert_file=files["client.pem"], key_file=files["client.key"],
                           token=token, token_file=token_file, **kw)


def test_tls_client_certificate_and_token(server):
    _, _, tmp = server
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 4, 2, 8)).astype(np.float32) for _ in range(3))
    with _client(server, token_file=os.path.join(tmp, "alice.token")) as c:
        assert c.server_info().version
        r = c.attend(q, k, v)
        assert r.o.shape == (1, 4, 2, 8) and np.isfinite(r.o).all()
        with c.create_sequence(num_layers=1, num_heads=2, num_kv_heads=2, head_dim=8) as seq:
            out = seq.extend(0, 0, q[0], k[0], v[0])
            assert out.length == 4
            with _client(server, token=BOB) as bob:
                with pytest.raises(ac.NotFound):
                    bob.sequence(seq.id)


@pytest.mark.parametrize("token", [None, "not-a-known-token-000000"])
def test_missing_or_unknown_token_is_unauthenticated(server, token):
    with _client(server, token=token) as c:
        with pytest.raises(ac.AttentionError) as e:
            c.server_info()
        assert e.value.code.name == "UNAUTHENTICATED"


def test_plaintext_client_cannot_connect(server):
    target, _, _ = server
    with AttentionClient(target, timeout=5, token=ALICE) as c:
        with pytest.raises(ac.AttentionError) as e:
            c.server_info()
        assert e.value.code.name == "UNAVAILABLE"


def test_client_rejects_inconsistent_options(server):
    target, files, _ = server
    with pytest.raises(ValueError):
        AttentionClient(target, cert_file=files["client.pem"])
    with pytest.raises(ValueError):
        AttentionClient(target, token="x", token_file=files["ca.pem"])
