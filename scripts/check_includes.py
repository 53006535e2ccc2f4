#!/usr/bin/env python3
"""Include-graph check: every include in server/, client/, kernels/ and common/ points downward.

The rule (docs/architecture.md, issue 17 item 4):
  service -> batching -> backends -> {kv_cache, device} -> kernels;
  shm (host shared-memory regions) sits beside kv_cache: included by service and main only, it
  includes only the neutral layers;
  backends/paged may include kv_cache (it reads pages and block tables) and device;
  kv_cache includes neither backends, device nor kernels' compute headers (page-format headers
  are allowed); validation, metrics, security, health, config are used from above and include
  only common and kv_cache types; client includes proto and common only; kernels include
  nothing of server or client.

How a file gets its layer: by its folder (server/<folder>/..., server/backends/paged/...,
server/main.cc and server/startup/ are `main`, server/memory/ counts as `device` because it folds into it, client/**
is `client`, kernels/** is `kernels`, the top-level common/** is `common`).
How an include gets its layer: every `#include "..."` is resolved (1) next to the including
file if that file exists, (2) by prefix: attention/v1/ and grpc/ are generated protos
(`proto`), attn/common/ is `common`, attn/kernels/<name> is one of the three kernels layers
below, version.h is the generated build header (`gen`), (3) by its first folder: a folder of
client/ (for client files) or of server/. `#include <grpcpp/...>` and `<grpc/...>` are `grpc`;
other angle-bracket includes (the standard library, CUDA, spdlog, ...) are not checked, and
quoted includes that resolve to nothing are listed as notes, not failures.

Usage: scripts/check_includes.py [--root DIR]   (DIR defaults to the repository root)
Exit status: 0 when every include is allowed; 1 with one line per forbidden include
("file:line: <layer> may not include <target> (<layer>): rule: ..."); 2 for a bad argument.
Standard-library Python only.
"""

import argparse
import os
import re
import sys

# The kernels' public headers (kernels/include/attn/kernels/) fall in three layers: neutral
# types every layer may use (Status itself is in common/: attn/common/status.h), the paged-KV
# page format that kv_cache may use, and compute (everything else: only backends and above).
KERNEL_TYPE_HEADERS = {"attention_problem.h", "host_dtype.h"}
KERNEL_PAGE_FORMAT_HEADERS = {"paged_kv.h", "paged_kv_cpu.h"}

_KERNELS = {"kernels:types", "kernels:page-format", "kernels:compute"}
_SIDE = {"validation", "metrics", "security", "health", "config"}
_NEUTRAL = {"common", "server/common", "kernels:types", "gen"}

# The allowed arrows: layer -> the layers its files may include (a layer may always include
# itself). Everything not listed is forbidden. "Downward" is transitive: service may include
# anything batching may, and more.
ALLOWED = {
    # The composition root opens everything (but not the client).
    "main": {"service", "batching", "backends", "backends/paged", "kv_cache", "shm", "device",
             "proto", "grpc"} | _SIDE | _KERNELS | _NEUTRAL,
    "service": {"batching", "backends", "backends/paged", "kv_cache", "shm", "device", "proto",
                "grpc"} | _SIDE | _KERNELS | _NEUTRAL,
    # batching: no gRPC and no protos (the services build every proto in their callbacks).
    "batching": {"backends", "backends/paged", "kv_cache", "device"} | _SIDE | _KERNELS | _NEUTRAL,
    # backends may read protos only to fill GetServerInfo's backend sections (calibration table,
    # cuDNN cache); no gRPC.
    "backends": {"backends/paged", "kv_cache", "device", "proto"} | _SIDE | _KERNELS | _NEUTRAL,
    "backends/paged": {"backends", "kv_cache", "device"} | _SIDE | _KERNELS | _NEUTRAL,
    # kv_cache is storage: pages, block tables, sequences, quotas.
    "kv_cache": {"kernels:page-format"} | _NEUTRAL,
    # shm: client shared-memory objects mapped as regions (issue 18), the SIGBUS guard; below
    # service, beside kv_cache: neither includes the other, and it needs no proto or gRPC.
    "shm": set(_NEUTRAL),
    # device: opening the GPU, the pool, the lane; below backends, beside kv_cache.
    "device": _KERNELS | _NEUTRAL,
    # Used from above; include only common and kv_cache types (and the protos / gRPC they face).
    "validation": {"kv_cache", "kernels:page-format", "proto"} | _NEUTRAL,
    "metrics": {"kv_cache", "kernels:page-format", "proto"} | _NEUTRAL,
    "security": {"kv_cache", "kernels:page-format", "proto", "grpc"} | _NEUTRAL,
    "health": {"kv_cache", "kernels:page-format", "proto", "grpc"} | _NEUTRAL,
    "config": {"kv_cache", "kernels:page-format"} | _NEUTRAL,
    # server/common: logging, sockets, small gRPC helpers shared by the server's layers.
    "server/common": {"common", "kernels:types", "gen", "grpc"},
    "client": {"proto", "common", "grpc"},
    "kernels": _KERNELS | {"common"},
    "common": set(),
}

# One line per layer for the error message: the rule a forbidden include breaks.
RULES = {
    "main": "main opens every server layer, never the client",
    "service": "service -> batching -> backends -> {kv_cache, device} -> kernels",
    "batching": "batching -> backends -> {kv_cache, device} -> kernels; no grpcpp, no protos, "
                "no service",
    "backends": "backends -> {kv_cache, device} -> kernels; not batching or service",
    "backends/paged": "backends/paged may include kv_cache and device",
    "kv_cache": "kv_cache includes neither backends, device nor kernels' compute headers "
                "(page-format headers are allowed), nor the layers used from above",
    "device": "device -> kernels only",
    "shm": "shm sits beside kv_cache below service and includes only common and neutral types",
    "validation": "validation is used from above and includes only common and kv_cache types",
    "metrics": "metrics is used from above and includes only common and kv_cache types",
    "security": "security is used from above and includes only common and kv_cache types",
    "health": "health is used from above and includes only common and kv_cache types",
    "config": "config is used from above and includes only common and kv_cache types",
    "server/common": "server/common includes only common and neutral kernel types",
    "client": "client includes proto and common only",
    "kernels": "kernels include nothing of server or client",
    "common": "common includes nothing of the project",
}

SCANNED_TOPS = ("server", "client", "kernels", "common")
SOURCE_SUFFIXES = (".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh", ".inc")
SERVER_FOLDER_ALIASES = {"memory": "device"}  # memory/ folds into device/ (issue 17 item 2)
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


def file_layer(rel):
    """The layer of a file given by its path relative to the root (forward slashes)."""
    parts = rel.split("/")
    top = parts[0]
    if top == "server":
        if len(parts) == 2:
            return "main" if parts[1] == "main.cc" else "server"
        folder = parts[1]
        if folder == "backends" and len(parts) > 3 and parts[2] == "paged":
            return "backends/paged"
        if folder == "common":
            return "server/common"
        if folder == "startup":
            return "main"  # main.cc's start-up and drain steps
        return SERVER_FOLDER_ALIASES.get(folder, folder)
    if top in ("client", "kernels", "common"):
        if top == "kernels" and rel.startswith("kernels/include/attn/kernels/"):
            return kernel_header_layer(parts[-1])
        return top
    return None


def kernel_header_layer(name):
    if name in KERNEL_TYPE_HEADERS:
        return "kernels:types"
    if name in KERNEL_PAGE_FORMAT_HEADERS:
        return "kernels:page-format"
    return "kernels:compute"


def include_layer(root, rel, target, server_folders, client_folders):
    """The layer an `#include "target"` in file `rel` resolves to, or None when unknown."""
    here = os.path.dirname(rel)
    local = os.path.normpath(os.path.join(here, target)).replace(os.sep, "/")
    if not local.startswith("..") and os.path.isfile(os.path.join(root, local)):
        return file_layer(local)
    if target.startswith("attention/v1/") or target.startswith("grpc/"):
        return "proto"
    if target.startswith("attn/common/"):
        return "common"
    if target.startswith("attn/kernels/"):
        return kernel_header_layer(target.split("/")[-1])
    if target == "version.h":
        return "gen"
    first = target.split("/")[0]
    if "/" not in target:
        return None
    if rel.startswith("client/") and first in client_folders:
        return "client"
    if first in server_folders:
        return file_layer("server/" + target)
    return None


def list_folders(path):
    if not os.path.isdir(path):
        return set()
    return {d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d))}


def scan(root):
    """Returns (violations, notes): lists of printable lines."""
    server_folders = list_folders(os.path.join(root, "server")) | set(SERVER_FOLDER_ALIASES)
    server_folders |= {"service", "batching", "backends", "kv_cache", "shm", "device",
                       "validation", "metrics", "security", "health", "config", "common"}
    client_folders = list_folders(os.path.join(root, "client"))
    violations, notes = [], []
    for top in SCANNED_TOPS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                layer = file_layer(rel)
                if layer is not None and layer.startswith("kernels:"):
                    layer = "kernels"  # the kernels' own headers: one layer for their includes
                if layer is None or layer not in ALLOWED:
                    notes.append(f"{rel}: no layer for this file (not checked)")
                    continue
                with open(path, encoding="utf-8", errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE_RE.match(line)
                        if not m:
                            continue
                        bracket, target = m.group(1), m.group(2)
                        if bracket == "<":
                            if not (target.startswith("grpcpp/") or target.startswith("grpc/")):
                                continue
                            to = "grpc"
                        else:
                            to = include_layer(root, rel, target, server_folders, client_folders)
                            if to is None:
                                notes.append(f"{rel}:{lineno}: \"{target}\" resolves to no "
                                             "layer (not checked)")
                                continue
                        if to == layer:
                            continue
                        if to in ALLOWED[layer]:
                            continue
                        shown = f"<{target}>" if bracket == "<" else f"\"{target}\""
                        violations.append(f"{rel}:{lineno}: {layer} may not include {shown} "
                                          f"({to}): rule: {RULES[layer]}")
    return violations, notes


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.dirname(here),
                        help="tree to check (holds server/, client/, kernels/, common/)")
    parser.add_argument("--notes", action="store_true",
                        help="also print the includes and files that were not checked")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.root):
        print(f"check_includes: no such folder: {args.root}", file=sys.stderr)
        return 2
    violations, notes = scan(args.root)
    if args.notes:
        for n in notes:
            print(f"note: {n}")
    for v in violations:
        print(v)
    if violations:
        print(f"check_includes: {len(violations)} forbidden include(s)", file=sys.stderr)
        return 1
    print("check_includes: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
