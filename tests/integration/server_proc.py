"""The real attention-server binary on a free loopback port, for Python integration, fault and
soak tests: start with extra flags, wait until it serves, health checks (grpc.health.v1 with raw
bytes, no extra package), resident memory (/proc/<pid>/status VmRSS), KV pages in use
(GetServerInfo), and stop with a signal returning the exit status.

The binary comes from ATTN_SERVER_BIN (default build/server/attention-server).
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

import grpc

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
from attention_client._pb import attention_pb2 as pb  # noqa: E402
from attention_client._pb import attention_pb2_grpc as pb_grpc  # noqa: E402

SERVER = os.environ.get("ATTN_SERVER_BIN", os.path.join(ROOT, "build/server/attention-server"))
HEALTH = {b"": "UNKNOWN", b"\x08\x00": "UNKNOWN", b"\x08\x01": "SERVING",
          b"\x08\x02": "NOT_SERVING", b"\x08\x03": "SERVICE_UNKNOWN"}


def _identity(x):
    return x


class ServerProc:
    """attention-server --listen 127.0.0.1:0 --metrics-address "" plus `args`.

    Use as a context manager (stops it with SIGTERM on exit) or call stop().
    """

    def __init__(self, *args, start_timeout_s=30.0, env=None):
        self.tmp = tempfile.TemporaryDirectory(prefix="attn-server-")
        port_file = os.path.join(self.tmp.name, "port")
        self.log_path = os.path.join(self.tmp.name, "server.log")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [SERVER, "--listen", "127.0.0.1:0", "--port-file", port_file,
             "--metrics-address", "", *args],
            stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.port = 0
        deadline = time.time() + start_timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()}")
            if os.path.exists(port_file):
                text = open(port_file).read().strip()
                if text:
                    self.port = int(text)
                    break
            time.sleep(0.05)
        if not self.port:
            self.stop()
            raise RuntimeError("server did not start: " + self.log())
        self.channel = grpc.insecure_channel(self.target)

    @property
    def target(self):
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self):
        return self.proc.pid

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def log(self):
        self._log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def alive(self):
        return self.proc.poll() is None

    def health(self, service="", timeout=5.0):
        """grpc.health.v1 Check → "SERVING", "NOT_SERVING", ... or "rpc error: CODE"."""
        check = self.channel.unary_unary("/grpc.health.v1.Health/Check",
                                         request_serializer=_identity,
                                         response_deserializer=_identity)
        s = service.encode()
        req = b"" if not s else b"\x0a" + bytes([len(s)]) + s
        try:
            return HEALTH.get(check(req, timeout=timeout), "UNPARSED")
        except grpc.RpcError as e:
            return f"rpc error: {e.code().name}"

    def under_asan(self):
        """True when the server runs with AddressSanitizer's runtime (libasan mapped: the CI's
        ASan stage, scripts/build.sh --sanitize), whose shadow memory and redzones add to RSS."""
        with open(f"/proc/{self.pid}/maps") as f:
            return any("libasan" in line for line in f)

    def rss_bytes(self):
        """Resident memory of the server process (VmRSS), bytes."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def server_info(self, timeout=10.0):
        return pb_grpc.AttentionServiceStub(self.channel).GetServerInfo(
            pb.GetServerInfoRequest(), timeout=timeout)

    def kv_usage(self):
        """(pages used over every layout class, live sequences) from GetServerInfo."""
        kv = self.server_info().kv_cache
        return sum(c.pages_used for c in kv.classes), kv.sequences

    def send_signal(self, sig):
        self.proc.send_signal(sig)

    def wait(self, timeout):
        """Exit status, or None if still running after `timeout` seconds."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, sig=signal.SIGTERM, timeout=30.0):
        """Signals the server (if running) and returns its exit status (killed: negative)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "channel", None) is not None:
            self.channel.close()
            self.channel = None
        self._log.close()
        return self.proc.returncode
