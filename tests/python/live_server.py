"""The real attention-server for the Python client tests, on TCP loopback or a Unix socket.

    with LiveServer("unix", tmp_dir, "--auth-token-file", f) as s:
        AttentionClient(s.target)  # "unix:/tmp/.../attn.sock" or "127.0.0.1:PORT"

Binary: ATTN_SERVER_BIN (default build/server/attention-server). The cpu backend and host KV
cache; ready once --port-file is written (the server writes it after binding).
"""
import os
import signal
import subprocess
import time

SERVER = os.environ.get("ATTN_SERVER_BIN", "build/server/attention-server")


class LiveServer:
    """transport: "tcp" (127.0.0.1, a free port) or "unix" (tmp_dir/attn.sock). extra: flags.
    stop() sends SIGTERM and returns the exit status (asserting nothing)."""

    def __init__(self, transport, tmp_dir, *extra, start_timeout_s=30.0):
        tmp_dir = str(tmp_dir)
        self.socket_path = os.path.join(tmp_dir, "attn.sock") if transport == "unix" else None
        listen = f"unix:{self.socket_path}" if self.socket_path else "127.0.0.1:0"
        port_file = os.path.join(tmp_dir, "port")
        self.log_path = os.path.join(tmp_dir, "server.log")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [SERVER, "--listen", listen, "--port-file", port_file, "--metrics-address", "",
             "--default-backend", "cpu", "--kv-device", "cpu", "--log-level", "info", *extra],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.time() + start_timeout_s
        text = ""
        while time.time() < deadline and not text:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()}")
            if os.path.exists(port_file):
                text = open(port_file).read().strip()
            time.sleep(0.05)
        if not text:
            self.stop()
            raise RuntimeError("server did not start: " + self.log())
        self.target = text if self.socket_path else f"127.0.0.1:{int(text)}"

    def log(self):
        self._log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, timeout=30.0):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
