#!/usr/bin/env python3
"""Checks examples/prometheus with Prometheus's own tool and the Grafana
dashboard against the fields it uses (no Grafana server):

  promtool check config   the scrape configs (static, file-based and Kubernetes discovery)
  promtool check web-config  serve's TLS and basic auth (web-config.yml), beside the
                          test certificate where its relative paths point
  promtool check rules    the recording and alerting rules
  promtool test rules     the rules on made-up series: each alert fires when it should
  the dashboard           JSON with the fields Grafana reads (panels, gridPos, targets),
                          every metric it names documented in docs/metrics.md or
                          recorded by the rules, every expression valid PromQL (promtool)

usage: check_prometheus_examples.py SOURCE_DIR
Exits 77 (skipped) without promtool (Debian's prometheus package).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

src = sys.argv[1]
examples = os.path.join(src, "examples", "prometheus")
promtool = shutil.which("promtool")
if not promtool:
    print("skipped: promtool not found (apt-get install prometheus, scripts/install-deps.sh)")
    sys.exit(77)
failures = []


def run(*args):
    p = subprocess.run([promtool, *args], capture_output=True, text=True)
    print("$ promtool", " ".join(args), "->", p.returncode)
    if p.returncode != 0:
        failures.append(f"promtool {' '.join(args)}:\n{p.stdout}{p.stderr}")
    return p


run("check", "config", os.path.join(examples, "prometheus.yml"))
# Debian builds Prometheus without Kubernetes service discovery: its promtool
# then checks the same file with the discovery swapped for a static target,
# which still checks everything else (the relabelling, the rule files).
kube = os.path.join(examples, "kubernetes", "prometheus.yml")
p = subprocess.run([promtool, "check", "config", kube], capture_output=True, text=True)
if p.returncode != 0 and "field kubernetes_sd_configs not found" in p.stdout + p.stderr:
    text = open(kube).read()
    swapped = re.sub(r"kubernetes_sd_configs:\n(\s+)- role: pod",
                     r"static_configs:\n\1- targets: ['localhost:9400']", text)
    if swapped == text:
        failures.append("kubernetes/prometheus.yml: no kubernetes_sd_configs with role: pod to swap")
    with tempfile.TemporaryDirectory() as tmp:  # its rule file where the config looks for it
        os.mkdir(os.path.join(tmp, "kubernetes"))
        shutil.copy(os.path.join(examples, "fullburn-rules.yml"), tmp)
        copy = os.path.join(tmp, "kubernetes", "prometheus.yml")
        with open(copy, "w") as f:
            f.write(swapped)
        print("promtool lacks Kubernetes discovery (Debian's build): checking the rest of", kube)
        run("check", "config", copy)
else:
    run("check", "config", kube)
with tempfile.TemporaryDirectory() as tmp:
    fixtures = os.path.join(src, "tests", "http", "fixtures")
    shutil.copy(os.path.join(examples, "web-config.yml"), tmp)
    shutil.copy(os.path.join(fixtures, "server.pem"), os.path.join(tmp, "tls.crt"))
    shutil.copy(os.path.join(fixtures, "server.key"), os.path.join(tmp, "tls.key"))
    run("check", "web-config", os.path.join(tmp, "web-config.yml"))
run("check", "rules", os.path.join(examples, "fullburn-rules.yml"))
run("test", "rules", os.path.join(examples, "tests", "fullburn-rules.test.yml"))

# The dashboard.
with open(os.path.join(examples, "grafana-dashboard.json")) as f:
    dash = json.load(f)
for key in ("title", "uid", "schemaVersion", "panels", "templating"):
    if key not in dash:
        failures.append(f"dashboard: no '{key}'")
variables = {v.get("name") for v in dash.get("templating", {}).get("list", [])}
documented = set(re.findall(r"`((?:DCGM_FI|fullburn)_[A-Za-z0-9_]+)`",
                            open(os.path.join(src, "docs", "metrics.md")).read()))
recorded = set(re.findall(r"record:\s*(\S+)",
                          open(os.path.join(examples, "fullburn-rules.yml")).read()))
ids, exprs = set(), []
for p in dash.get("panels", []):
    where = f"dashboard panel {p.get('id')} ({p.get('title')!r})"
    if not isinstance(p.get("id"), int) or p["id"] in ids:
        failures.append(f"{where}: id missing or repeated")
    ids.add(p.get("id"))
    if p.get("type") not in ("stat", "timeseries", "table", "bargauge", "gauge"):
        failures.append(f"{where}: unknown type {p.get('type')!r}")
    if not p.get("title"):
        failures.append(f"{where}: no title")
    g = p.get("gridPos", {})
    if not all(isinstance(g.get(k), int) for k in "xywh") or g.get("x", 0) + g.get("w", 0) > 24:
        failures.append(f"{where}: gridPos needs integer x, y, w, h within 24 columns: {g}")
    uid = p.get("datasource", {}).get("uid", "")
    m = re.fullmatch(r"\$\{(\w+)\}", uid)
    if p.get("datasource", {}).get("type") != "prometheus" or not m or m.group(1) not in variables:
        failures.append(f"{where}: datasource must be a prometheus one named by a dashboard variable")
    targets = p.get("targets", [])
    if not targets:
        failures.append(f"{where}: no targets")
    refs = [t.get("refId") for t in targets]
    if len(set(refs)) != len(refs) or not all(refs):
        failures.append(f"{where}: refIds missing or repeated")
    for t in targets:
        expr = t.get("expr", "")
        if not expr:
            failures.append(f"{where}: a target without expr")
            continue
        exprs.append((where, expr))
        for name in re.findall(r"(?<![\w:\"])((?:DCGM_FI|fullburn)[A-Za-z0-9_:]*)", expr):
            if name not in documented and name not in recorded:
                failures.append(f"{where}: {name} is neither in docs/metrics.md nor recorded by the rules")

# Every expression is PromQL that promtool accepts, as a recording rule.
with tempfile.TemporaryDirectory() as tmp:
    rules = os.path.join(tmp, "dashboard-rules.yml")
    with open(rules, "w") as f:
        f.write("groups:\n  - name: dashboard\n    rules:\n")
        for i, (where, expr) in enumerate(exprs):
            f.write(f"      - record: dashboard:expr_{i}\n        expr: {json.dumps(expr)}\n")
    run("check", "rules", rules)

if failures:
    print("\n".join(failures))
    sys.exit(1)
print(f"ok: configs, rules, rule tests and {len(exprs)} dashboard expressions")
