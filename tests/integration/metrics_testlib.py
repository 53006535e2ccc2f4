"""Helpers for the metrics integration tests: start the real attention-server with its
Prometheus endpoint on a free loopback port, scrape it (urllib only), parse the text format,
run attention-loadgen, and a minimal PromQL metric-name extractor.

Binaries come from the environment: ATTN_SERVER_BIN, ATTN_LOADGEN_BIN, PROMTOOL, PROMETHEUS.
"""
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

SERVER = os.environ.get("ATTN_SERVER_BIN", "build/server/attention-server")
LOADGEN = os.environ.get("ATTN_LOADGEN_BIN", "build/client/attention-loadgen")
PROMTOOL = os.environ.get("PROMTOOL", "promtool")
PROMETHEUS = os.environ.get("PROMETHEUS", "prometheus")
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

_METRICS_LOG = re.compile(r"metrics: http://[^\s/]*:(\d+)/metrics")


class Server:
    """attention-server on 127.0.0.1:0 with --metrics-address 127.0.0.1:0."""

    def __init__(self, *extra_args):
        self.tmp = tempfile.TemporaryDirectory(prefix="attn-metrics-")
        port_file = os.path.join(self.tmp.name, "port")
        self.log_path = os.path.join(self.tmp.name, "server.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [SERVER, "--listen", "127.0.0.1:0", "--port-file", port_file,
             "--metrics-address", "127.0.0.1:0", *extra_args],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        self.port = self.metrics_port = 0
        while time.time() < deadline and not (self.port and self.metrics_port):
            if self.proc.poll() is not None:
                raise RuntimeError("server exited: " + self.read_log())
            if os.path.exists(port_file) and open(port_file).read().strip():
                self.port = int(open(port_file).read())
            m = _METRICS_LOG.search(self.read_log())
            if m:
                self.metrics_port = int(m.group(1))
            time.sleep(0.05)
        if not (self.port and self.metrics_port):
            self.stop()
            raise RuntimeError("server did not start: " + self.read_log())

    @property
    def target(self):
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_target(self):
        return f"127.0.0.1:{self.metrics_port}"

    def read_log(self):
        with open(self.log_path) as f:
            return f.read()

    def scrape(self):
        with urllib.request.urlopen(f"http://{self.metrics_target}/metrics", timeout=10) as r:
            assert r.status == 200
            return r.read().decode()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                code = self.proc.wait()
        else:
            code = self.proc.returncode
        self.log.close()
        return code

    def close(self):
        code = self.stop()
        self.tmp.cleanup()
        return code


def run_loadgen(target, *args, timeout=120):
    """Runs attention-loadgen against `target`; returns its JSON report."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "report.json")
        out = subprocess.run([LOADGEN, "--target", target, "--json", path, *args],
                             capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, out.stdout + out.stderr
        with open(path) as f:
            return json.load(f)


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\d+)?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """Text exposition → (samples: list of (name, labels dict, value), types: name → type)."""
    samples, types = [], {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            types[name] = kind
            continue
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, f"unparsable line: {line!r}"
        labels = dict(_LABEL.findall(m.group(3) or ""))
        samples.append((m.group(1), labels, float(m.group(4))))
    return samples, types


def value(samples, name, **labels):
    """Sum of the samples of `name` whose labels include `labels`."""
    return sum(v for n, l, v in samples
               if n == name and all(l.get(k) == str(w) for k, w in labels.items()))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- PromQL metric names ----

_PROMQL_WORDS = {
    # aggregations, keywords and modifiers that look like identifiers
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "by", "without", "on", "ignoring", "group_left",
    "group_right", "bool", "and", "or", "unless", "offset", "atan2", "inf", "nan",
}


def promql_metric_names(expr):
    """The metric names an expression selects (functions, labels, keywords, numbers, strings,
    durations and Grafana $variables removed)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)         # strings
    e = re.sub(r"\{[^}]*\}", " ", e)                      # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)                     # ranges / subqueries
    e = re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", " ", e)  # Grafana variables
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\boffset\s+\S+", " ", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        rest = e[m.end():].lstrip()
        if rest.startswith("("):
            continue  # a function or an aggregation
        if word.lower() in _PROMQL_WORDS:
            continue
        if re.fullmatch(r"[0-9.eE+-]+", word):
            continue
        names.add(word)
    return names


def dashboard_exprs(dashboard):
    """Every PromQL expression in a Grafana dashboard JSON (panel targets, nested rows,
    templating queries)."""
    exprs = []

    def walk(node):
        if isinstance(node, dict):
            for key in ("expr",):
                if isinstance(node.get(key), str):
                    exprs.append(node[key])
            q = node.get("query")
            if node.get("type") == "query" and isinstance(q, (str, dict)):
                qs = q if isinstance(q, str) else q.get("query", "")
                m = re.match(r"\s*label_values\((.*)\)\s*$", qs)
                if m:
                    exprs.append(m.group(1).rsplit(",", 1)[0])
                elif qs:
                    exprs.append(qs)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(dashboard)
    return exprs
