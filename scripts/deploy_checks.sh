#!/usr/bin/env bash
# Deployment checks (ctest label deploy; DESIGN.md §12), all offline once scripts/bootstrap.sh
# has installed the tools:
#  1. render the kustomize overlay deploy/k8s/overlays/gke-l4 (kubectl kustomize);
#  2. validate every rendered resource against the Kubernetes schemas (kubernetes-validate,
#     --strict); the PodMonitoring CRD, which it has no schema for, against
#     deploy/k8s/schemas/podmonitoring-v1.json (in step 5);
#  3. checkov over deploy/terraform, the rendered manifests and the Dockerfile (each finding is
#     fixed or skipped inline with a reason: "checkov:skip=" comments / annotations);
#  4. hadolint on the Dockerfile;
#  5. scripts/deploy_consistency.py: ports, probes, drain timing, flags, HPA metrics, connection
#     age, alert names and thresholds, terraform;
#  6. promtool: check config (deploy/prometheus/prometheus.yml), check rules (alerts.yml) and
#     the alert unit tests (alerts_test.yml); skipped with a message when promtool is missing.
# Usage: scripts/deploy_checks.sh ATTENTION_SERVER_BIN
# Tools: kubectl (and promtool, from scripts/bootstrap.sh's Prometheus) on PATH; checkov,
# kubernetes-validate, hadolint in $ATTN_DEPLOY_VENV
# (default ~/.cache/attention-server/deploy-venv).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
server=${1:?usage: deploy_checks.sh ATTENTION_SERVER_BIN}
venv=${ATTN_DEPLOY_VENV:-$HOME/.cache/attention-server/deploy-venv}
k8s_version=${ATTN_K8S_VERSION:-1.31.0}
for tool in "$venv/bin/checkov" "$venv/bin/kubernetes-validate" "$venv/bin/hadolint"; do
  [ -x "$tool" ] || { echo "missing $tool: run scripts/bootstrap.sh"; exit 1; }
done
command -v kubectl >/dev/null || { echo "missing kubectl: run scripts/bootstrap.sh"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export BC_SKIP_MAPPING=TRUE  # checkov: no network look-ups

echo "== render (kubectl kustomize, $(kubectl version --client 2>/dev/null | head -1))"
kubectl kustomize "$root/deploy/k8s/overlays/gke-l4" >"$work/rendered.yaml"
grep -c '^kind:' "$work/rendered.yaml" | xargs echo "resources:"

echo "== kubernetes-validate --strict (Kubernetes $k8s_version)"
"$venv/bin/python" - "$work/rendered.yaml" "$work/core.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
core = [d for d in docs if not d["apiVersion"].startswith("monitoring.googleapis.com/")]
yaml.safe_dump_all(core, open(sys.argv[2], "w"))
print(f"{len(core)} core resources; {len(docs) - len(core)} CRD resources checked in step 5")
PY
"$venv/bin/kubernetes-validate" --strict -k "$k8s_version" "$work/core.yaml" | tee "$work/kv.log"
if grep -q -E "^(WARN|ERROR)" "$work/kv.log"; then echo "kubernetes-validate: not clean"; exit 1; fi

echo "== checkov (terraform, kubernetes, dockerfile)"
"$venv/bin/checkov" --quiet --compact --skip-download -d "$root/deploy/terraform" \
  --framework terraform
"$venv/bin/checkov" --quiet --compact --skip-download -f "$work/rendered.yaml" \
  --framework kubernetes
"$venv/bin/checkov" --quiet --compact --skip-download -f "$root/Dockerfile" --framework dockerfile

echo "== hadolint"
"$venv/bin/hadolint" "$root/Dockerfile"
echo "hadolint: clean"

echo "== consistency"
"$venv/bin/python" "$root/scripts/deploy_consistency.py" "$work/rendered.yaml" "$server" "$root"

echo "== promtool (Prometheus config, alert rules, alert unit tests)"
if command -v promtool >/dev/null; then
  promtool check config "$root/deploy/prometheus/prometheus.yml"
  promtool check rules "$root/deploy/prometheus/alerts.yml"
  (cd "$root/deploy/prometheus" && promtool test rules alerts_test.yml)
else
  echo "promtool: SKIPPED (not on PATH; scripts/bootstrap.sh installs Prometheus)"
fi
echo "deploy checks: all passed"
