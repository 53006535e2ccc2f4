"""scripts/check_includes.py on small fixture trees written to a temporary folder.

One fixture per kind of upward include that issue 17 found in the tree (each must fail with
exit status 1 and name the file, the line and the rule), one tree that uses every allowed
arrow (must pass), and the checker's own argument error. No build is needed: the checker reads
sources only.
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKER = os.path.join(ROOT, "scripts", "check_includes.py")


def write_tree(root, files):
    """files: {relative path: text}."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def run_checker(root):
    return subprocess.run([sys.executable, CHECKER, "--root", str(root)], capture_output=True,
                          text=True, timeout=60)


def header(*includes):
    """A header whose includes are `includes` ("x.h" quoted, <x.h> angle), from line 2 on."""
    lines = ["#pragma once"]
    for inc in includes:
        lines.append(f"#include {inc}" if inc.startswith("<") else f'#include "{inc}"')
    return "\n".join(lines) + "\n"


# The targets the fixtures include: present so that each include resolves like in the tree.
BASE = {
    "server/service/attention_service.h": header("batching/batch_scheduler.h"),
    "server/service/worker_pool.h": header(),
    "server/batching/batch_scheduler.h": header("backends/backend.h"),
    "server/backends/backend.h": header("kv_cache/page_pool.h", "attn/common/status.h"),
    "server/kv_cache/page_pool.h": header("attn/kernels/paged_kv.h"),
    "server/security/identity_quota.h": header(),
    "server/common/logging.h": header(),
    "server/common/cli_finite.h": header(),
    "common/include/attn/common/status.h": header(),
    "kernels/include/attn/kernels/paged_kv.h": header("attn/common/status.h"),
    "kernels/include/attn/kernels/cpu_attention.h": header("attn/common/status.h"),
    "client/loadgen/main.cc": header("loadgen/runner.h", "attention/v1/attention.grpc.pb.h",
                                     "attn/common/cli_finite.h"),
    "client/loadgen/runner.h": header(),
    "common/include/attn/common/cli_finite.h": header(),
}

# (name, offending file, its includes, the layer and target the message must name)
UPWARD = [
    ("backends_includes_service_header", "server/backends/backend_factory.h",
     ["backends/backend.h", "service/attention_service.h"], "backends", "service"),
    ("kv_cache_includes_service_header", "server/kv_cache/kv_runtime.h",
     ["kv_cache/page_pool.h", "service/attention_service.h"], "kv_cache", "service"),
    ("metrics_includes_service_header", "server/metrics/build_info.h",
     ["service/attention_service.h"], "metrics", "service"),
    ("kv_cache_includes_security", "server/kv_cache/sequence_store.h",
     ["kv_cache/page_pool.h", "security/identity_quota.h"], "kv_cache", "security"),
    ("kv_cache_includes_backends", "server/kv_cache/kv_runtime.cc",
     ["kv_cache/page_pool.h", "backends/backend.h"], "kv_cache", "backends"),
    ("kv_cache_includes_kernels_compute", "server/kv_cache/cpu_paged_attention.cc",
     ["attn/kernels/paged_kv.h", "attn/kernels/cpu_attention.h"], "kv_cache",
     "kernels:compute"),
    ("batching_includes_grpcpp", "server/batching/step_batcher.h",
     ["batching/batch_scheduler.h", "<grpcpp/grpcpp.h>"], "batching", "grpc"),
    ("batching_includes_proto", "server/batching/step_batcher.cc",
     ["batching/batch_scheduler.h", "attention/v1/sequence.pb.h"], "batching", "proto"),
    ("batching_includes_service", "server/batching/step_batcher.h",
     ["batching/batch_scheduler.h", "service/worker_pool.h"], "batching", "service"),
    ("client_includes_server_common", "client/loadgen/flags.cc",
     ["loadgen/runner.h", "common/cli_finite.h"], "client", "server/common"),
    ("client_includes_server_backends", "client/loadgen/oracle.cc",
     ["backends/backend.h"], "client", "backends"),
    ("kernels_include_server", "kernels/cpu/cpu_attention.cc",
     ["attn/kernels/cpu_attention.h", "common/logging.h"], "kernels", "server/common"),
]


@pytest.mark.parametrize("name,path,includes,layer,target", UPWARD, ids=[u[0] for u in UPWARD])
def test_each_upward_include_fails(tmp_path, name, path, includes, layer, target):
    write_tree(tmp_path, BASE)
    write_tree(tmp_path, {path: header(*includes)})
    r = run_checker(tmp_path)
    assert r.returncode == 1, (name, r.stdout, r.stderr)
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    # Exactly the one offending include is reported: the last one, at line 1 + len(includes).
    assert len(lines) == 1, r.stdout
    assert lines[0].startswith(f"{path}:{1 + len(includes)}: {layer} may not include "), lines
    assert f"({target}): rule: " in lines[0], lines


def test_every_allowed_arrow_passes(tmp_path):
    write_tree(tmp_path, BASE)
    write_tree(tmp_path, {
        "server/main.cc": header("service/attention_service.h", "health/health_listener.h",
                                 "<grpcpp/grpcpp.h>", "version.h"),
        "server/health/health_listener.h": header("<grpcpp/grpcpp.h>", "common/logging.h"),
        "server/service/sequence_service.cc": header(
            "service/attention_service.h", "attention/v1/sequence.grpc.pb.h",
            "validation/sequence_validator.h", "kv_cache/page_pool.h", "<grpcpp/grpcpp.h>"),
        "server/batching/attend_batcher.h": header(
            "backends/backend.h", "validation/attend_validator.h", "device/lane.h",
            "attn/common/status.h"),
        "server/backends/backend_factory.h": header("backends/server_facts.h",
                                                    "config/server_config.h",
                                                    "backends/paged/paged_backend.h"),
        "server/backends/server_facts.h": header(),
        "server/backends/paged/paged_backend.h": header(
            "backends/backend.h", "kv_cache/page_pool.h", "device/lane.h",
            "attn/kernels/cpu_attention.h"),
        "server/device/lane.h": header("attn/common/status.h", "common/logging.h"),
        "server/validation/attend_validator.h": header(
            "attention/v1/attention.pb.h", "kv_cache/page_pool.h", "attn/common/status.h"),
        "server/validation/sequence_validator.h": header("kv_cache/page_pool.h"),
        "server/config/server_config.h": header("attn/common/cli_finite.h"),
        "kernels/cpu/cpu_attention.cc": header("attn/kernels/cpu_attention.h",
                                               "attn/common/cli_finite.h", "../common/x.cuh"),
        "kernels/common/x.cuh": header(),
    })
    r = run_checker(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "check_includes: ok" in r.stdout


def test_missing_root_is_a_usage_error(tmp_path):
    r = run_checker(tmp_path / "absent")
    assert r.returncode == 2
    assert "no such folder" in r.stderr
