#!/usr/bin/env python3
"""Cross-checks the deployment files against each other and against the server itself
(scripts/deploy_checks.sh runs it with the deploy virtual environment's Python).

Usage: deploy_consistency.py RENDERED_YAML SERVER_BIN REPO_ROOT

Fails (exit 1, one line per problem) when:
- a ConfigMap key ATTN_X is not a flag of `attention-server --help` (--x);
- terminationGracePeriodSeconds < preStop sleep + ATTN_DRAIN_TIMEOUT_S + 15;
- probes, container ports, PodMonitoring, Service and Dockerfile EXPOSE disagree with the
  ports in ATTN_LISTEN / ATTN_HEALTH_ADDRESS / ATTN_METRICS_ADDRESS;
- the Deployment does not ask for one nvidia.com/gpu on nvidia-l4 nodes with a toleration, or
  its securityContext is not non-root / read-only / no escalation / drop ALL;
- an HPA metric is not a gauge the server exports (server/metrics/*.cc), or the HPA
  does not scale on both attn_requests_queued and attn_kv_used_ratio;
- the ConfigMap sets no connection age or grace, or deploy/prometheus/alerts.yml lacks an
  alert or its queue threshold is not a share of ATTN_MAX_QUEUE_REQUESTS;
- the PodMonitoring does not match the CRD schema subset (deploy/k8s/schemas);
- the terraform lacks the L4 pool with driver LATEST or Managed Prometheus.
"""
import json
import os
import re
import subprocess
import sys

import hcl2
import jsonschema
import yaml

rendered, server_bin, root = sys.argv[1:4]
docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
by_kind = {}
for d in docs:
    by_kind.setdefault(d["kind"], []).append(d)
problems = []


def check(cond, msg):
    if not cond:
        problems.append(msg)


def port_of(address):
    return int(address.rsplit(":", 1)[1])


flags = next(c for c in by_kind["ConfigMap"] if c["metadata"]["name"].endswith("-flags"))["data"]
help_text = subprocess.run([server_bin, "--help"], capture_output=True, text=True).stdout
known = set(re.findall(r"--([a-z0-9-]+)", help_text))
for key in flags:
    flag = key[len("ATTN_"):].lower().replace("_", "-")
    check(key.startswith("ATTN_") and flag in known, f"ConfigMap {key}: no flag --{flag}")

dep = by_kind["Deployment"][0]
pod = dep["spec"]["template"]["spec"]
c = pod["containers"][0]
sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
grace = pod["terminationGracePeriodSeconds"]
drain = float(flags["ATTN_DRAIN_TIMEOUT_S"])
check(grace >= sleep + drain + 15,
      f"terminationGracePeriodSeconds {grace} < preStop {sleep} + drain {drain} + 15")
check(flags.get("ATTN_DRAIN_WAIT_SEQUENCES") == "true", "ATTN_DRAIN_WAIT_SEQUENCES is not true")
env = {e["name"]: e for e in c.get("env", [])}
check(env.get("ATTN_ADVERTISE_ADDRESS", {}).get("value") ==
      f"$(POD_IP):{port_of(flags['ATTN_LISTEN'])}", "ATTN_ADVERTISE_ADDRESS is not POD_IP:grpc")
check(env.get("POD_IP", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") ==
      "status.podIP", "POD_IP does not come from status.podIP")

ports = {p["name"]: p["containerPort"] for p in c["ports"]}
want = {"grpc": port_of(flags["ATTN_LISTEN"]), "health": port_of(flags["ATTN_HEALTH_ADDRESS"]),
        "metrics": port_of(flags["ATTN_METRICS_ADDRESS"])}
check(ports == want, f"container ports {ports} != flags {want}")
for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
    g = c[probe].get("grpc", {})
    check(g.get("port") == want["health"], f"{probe} is not a gRPC probe on the health port")
check(c["readinessProbe"]["grpc"].get("service", "") == "", "readiness must probe service ''")
check(c["livenessProbe"]["grpc"].get("service") == "liveness", "liveness must probe 'liveness'")

res = c["resources"]
check(str(res["limits"].get("nvidia.com/gpu")) == "1", "limits nvidia.com/gpu != 1")
check(pod.get("nodeSelector", {}).get("cloud.google.com/gke-accelerator") == "nvidia-l4",
      "nodeSelector is not nvidia-l4")
check(any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])),
      "no toleration for nvidia.com/gpu")
sc, psc = c["securityContext"], pod["securityContext"]
check(psc.get("runAsNonRoot") is True and sc.get("readOnlyRootFilesystem") is True and
      sc.get("allowPrivilegeEscalation") is False and sc["capabilities"]["drop"] == ["ALL"],
      "securityContext is not non-root, read-only, no escalation, drop ALL")

svc = by_kind["Service"][0]
check(svc["spec"].get("clusterIP") == "None", "the Service is not headless")
check(all(p["targetPort"] in ports for p in svc["spec"]["ports"]), "Service targetPort unknown")

pm = by_kind["PodMonitoring"][0]
schema = json.load(open(f"{root}/deploy/k8s/schemas/podmonitoring-v1.json"))
try:
    jsonschema.validate(pm, schema)
except jsonschema.ValidationError as e:
    problems.append(f"PodMonitoring: {e.message}")
check(all(e["port"] == "metrics" for e in pm["spec"]["endpoints"]), "PodMonitoring port")

hpa = by_kind["HorizontalPodAutoscaler"][0]
# The scrape-time gauges are built in server/metrics/scrape_collector.cc; every metrics source
# is read so that moving them between files keeps this check honest.
gauges = set()
for name in sorted(os.listdir(f"{root}/server/metrics")):
    if name.endswith(".cc"):
        with open(f"{root}/server/metrics/{name}") as src:
            gauges |= set(re.findall(r'GaugeFamily\("(\w+)"', src.read()))
scaled_on = set()
for spec in hpa["spec"]["metrics"]:
    metric = spec["pods"]["metric"]["name"]
    m = re.fullmatch(r"prometheus\.googleapis\.com\|(\w+)\|gauge", metric)
    check(m is not None and m.group(1) in gauges, f"HPA metric {metric}: not a server gauge")
    if m:
        scaled_on.add(m.group(1))
check({"attn_requests_queued", "attn_kv_used_ratio"} <= scaled_on,
      f"HPA scales on {sorted(scaled_on)}, not on both queue depth and KV usage")
check(hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"], "HPA target")
check(by_kind.get("PodDisruptionBudget"), "no PodDisruptionBudget")

# Connection age (clients re-resolve the headless Service) with a bounded grace for streams.
age = float(flags.get("ATTN_MAX_CONNECTION_AGE_S", "0"))
age_grace = float(flags.get("ATTN_MAX_CONNECTION_AGE_GRACE_S", "0"))
check(age > 0, "ATTN_MAX_CONNECTION_AGE_S is not set: clients never re-resolve")
check(age_grace > 0, "ATTN_MAX_CONNECTION_AGE_GRACE_S is not set (0: aged connections never close)")
# The queue-saturation alert's threshold is 80 % of ATTN_MAX_QUEUE_REQUESTS.
alerts = yaml.safe_load(open(f"{root}/deploy/prometheus/alerts.yml"))
rules = {r["alert"]: r for g in alerts["groups"] for r in g["rules"]}
check(set(rules) >= {"AttentionServerDown", "AttentionServerHighErrorRatio",
                     "AttentionServerKvCacheNearlyFull", "AttentionServerStepLatencyHigh",
                     "AttentionServerQueueSaturated"}, f"alerts.yml lacks alerts: {sorted(rules)}")
queue_expr = rules.get("AttentionServerQueueSaturated", {}).get("expr", "")
check(f"* {flags['ATTN_MAX_QUEUE_REQUESTS']}" in queue_expr,
      f"queue alert {queue_expr!r} is not a share of ATTN_MAX_QUEUE_REQUESTS")

dockerfile = open(f"{root}/Dockerfile").read()
exposed = {int(p) for line in re.findall(r"^EXPOSE (.+)$", dockerfile, re.M)
           for p in line.split()}
check(exposed == set(want.values()), f"Dockerfile EXPOSE {exposed} != {set(want.values())}")
check(re.search(r"^USER 10001", dockerfile, re.M) is not None, "Dockerfile is not USER 10001")

# Terraform parsed with checkov's HCL parser (bc-python-hcl2): blocks and attribute values
# both come as lists.
with open(f"{root}/deploy/terraform/cluster.tf") as f:
    tf = hcl2.load(f)
resources = {}
for r in tf["resource"]:
    for rtype, named in r.items():
        for name, body in named.items():
            resources[(rtype, name)] = body
l4 = resources[("google_container_node_pool", "l4")]["node_config"][0]["guest_accelerator"][0]
check(l4["type"] == ["nvidia-l4"] and
      l4["gpu_driver_installation_config"][0]["gpu_driver_version"] == ["LATEST"],
      "terraform: no nvidia-l4 pool with gpu_driver_version LATEST")
cluster = resources[("google_container_cluster", "attention")]
check(cluster["monitoring_config"][0]["managed_prometheus"][0]["enabled"] == [True],
      "terraform: Managed Prometheus not enabled")

for p in problems:
    print("deploy consistency:", p)
print(f"deploy consistency: {len(problems)} problems in {len(docs)} resources")
sys.exit(1 if problems else 0)
