#!/usr/bin/env bash
# The Python client under its dependency floors: grpcio and protobuf at exactly the versions
# client/python/pyproject.toml declares as minimums (read from it), installed from PyPI into a
# venv (VENV, kept between runs and rebuilt when the floors change; --system-site-packages, so
# numpy and pytest come from the system and only the two floor wheels are fetched), then the
# client tests (API, fast path, Unix socket) against a live server.
# Usage: floor_deps_test.sh SERVER_BIN VENV_DIR. Exit 77 (skip) when PyPI cannot be reached.
set -euo pipefail
server=$1
venv=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
floors=$(python3 - "$root/client/python/pyproject.toml" <<'PY'
import re, sys
deps = re.search(r"^dependencies = \[(.*)\]$", open(sys.argv[1]).read(), re.M).group(1)
pins = []
for name in ("grpcio", "protobuf"):
    m = re.search(r'"%s>=([0-9.]+)' % name, deps)
    assert m, f"no {name} floor in {deps}"
    pins.append(f"{name}=={m.group(1)}")
print(" ".join(pins))
PY
)
echo "floors: $floors"
if [ ! -f "$venv/floors" ] || [ "$(cat "$venv/floors")" != "$floors" ]; then
  rm -rf "$venv"
  python3 -m venv --system-site-packages "$venv"
  # shellcheck disable=SC2086
  if ! "$venv/bin/pip" install -q --disable-pip-version-check --timeout 20 --retries 1 $floors; then
    echo "SKIP: could not install $floors from PyPI"
    rm -rf "$venv"
    exit 77
  fi
  echo "$floors" > "$venv/floors"
fi
"$venv/bin/python" - "$floors" <<'PY'
import sys
import grpc
import google.protobuf
want = dict(p.split("==") for p in sys.argv[1].split())
got = {"grpcio": grpc.__version__, "protobuf": google.protobuf.__version__}
assert got == want, (got, want)
print("running under", got)
PY
cd "$root"
ATTN_SERVER_BIN=$server PYTHONPATH=$root/client/python "$venv/bin/python" -m pytest -q \
  -p no:cacheprovider tests/python/test_client_api.py tests/python/test_client_fastpath.py \
  tests/python/test_client_wire.py tests/python/test_client_packed.py \
  tests/python/test_client_packed_wire.py tests/python/test_client_packed_fake.py \
  tests/python/test_unix_socket.py -k "not loadgen"
