#!/usr/bin/env python3
"""Regenerates the Argo CD customization's test files from its captured testdata and scripts.

    FLEETROLL_CAPTURE_TESTDATA=1 cargo test --features conformance --test it gitops::kstatus_flux  # live objects
    FLEETROLL_CAPTURE_TESTDATA=1 cargo test --test it analysis::no_data   # analysis holds (for the resume action)
    hack/argocd-testdata.py                     # health_test.yaml, actions/action_test.yaml, argocd-cm-patch.yaml

It runs the scripts with tests/testenv's gitops-judge (gopher-lua, as Argo CD runs them); review the diff:
the expected results it writes are what the scripts say now. Needs PyYAML.
"""
import json
import os
import subprocess

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JUDGE = os.path.join(ROOT, "target/testenv/bin/gitops-judge")
ARGO = os.path.join(ROOT, "manifests/argocd")
BASE = os.path.join(ARGO, "resource_customizations/fleetroll.dev/FleetRollout")
HEADER = "# Argo CD's test harness for resource customizations reads this; tests/it/gitops.rs runs it too.\n"
ROWS = ["unseen", "stale", "progressing", "paused", "waiting-for-approval", "rolling-back", "succeeded",
        "changed-by-others",
        "blocked", "paused-by-failures", "failed", "aborted", "rolled-back"]
ACTIONS = ["pause", "resume", "approve", "abort", "rollback"]


def judge(args, obj):
    out = subprocess.run([JUDGE] + args, input=json.dumps(obj).encode(), capture_output=True, check=True)
    return json.loads(out.stdout)


def load(path):
    with open(os.path.join(BASE, path)) as f:
        return yaml.safe_load(f)


def dump(path, header, data):
    with open(os.path.join(BASE, path), "w") as f:
        f.write(header)
        yaml.safe_dump(data, f, sort_keys=False, width=200)


def health_tests():
    tests = []
    for row in ROWS:
        h = judge(["lua-health", os.path.join(BASE, "health.lua")], load(f"testdata/{row}.yaml"))
        tests.append({"healthStatus": {"status": h["status"], "message": h["message"]},
                      "inputPath": f"testdata/{row}.yaml"})
    dump("health_test.yaml", HEADER, {"tests": tests})


def action_tests():
    os.makedirs(os.path.join(BASE, "actions/testdata"), exist_ok=True)
    discovery = []
    for row in ["waiting-for-approval", "paused", "progressing", "succeeded", "rolled-back",
                "analysis-inconclusive", "analysis-failed"]:
        obj = load(f"testdata/{row}.yaml")
        dump(f"actions/testdata/{row}.yaml", "", obj)
        offered = judge(["lua-discovery", os.path.join(BASE, "actions/discovery.lua")], obj)
        discovery.append({"inputPath": f"testdata/{row}.yaml",
                          "result": [{"name": a, "disabled": offered[a]["disabled"], "iconClass": offered[a]["iconClass"]}
                                     for a in sorted(ACTIONS)]})
    runs = []
    for action, row in [("approve", "waiting-for-approval"), ("pause", "progressing"), ("resume", "paused"),
                        ("resume", "analysis-inconclusive"), ("resume", "analysis-failed"),
                        ("abort", "progressing"), ("rollback", "succeeded")]:
        out = judge(["lua-action", os.path.join(BASE, f"actions/{action}/action.lua")], load(f"testdata/{row}.yaml"))
        expected = f"testdata/{row}-{action}.yaml"
        dump(f"actions/{expected}", "", out["object"])
        runs.append({"action": action, "inputPath": f"testdata/{row}.yaml", "expectedOutputPath": expected})
    dump("actions/action_test.yaml", HEADER, {"discoveryTests": discovery, "actionTests": runs})


def indent(text, n):
    return "".join((" " * n + line) if line.strip() else line for line in text.splitlines(True))


def read(path):
    with open(os.path.join(BASE, path)) as f:
        return f.read()


def argocd_cm():
    out = ["""# Argo CD's health check and actions for FleetRollouts, for argocd-cm (until they ship with Argo CD):
#   kubectl -n argocd patch configmap argocd-cm --patch-file manifests/argocd/argocd-cm-patch.yaml
# The scripts are the files under resource_customizations/fleetroll.dev/FleetRollout/ (tests/it/gitops.rs
# checks this copy matches them). They need only the base and table libraries (no useOpenLibs).
data:
  resource.customizations.health.fleetroll.dev_FleetRollout: |
""", indent(read("health.lua"), 4),
           "  resource.customizations.actions.fleetroll.dev_FleetRollout: |\n    discovery.lua: |\n",
           indent(read("actions/discovery.lua"), 6), "    definitions:\n"]
    for action in ACTIONS:
        out.append(f"      - name: {action}\n        action.lua: |\n")
        out.append(indent(read(f"actions/{action}/action.lua"), 10))
    with open(os.path.join(ARGO, "argocd-cm-patch.yaml"), "w") as f:
        f.write("".join(out))


if __name__ == "__main__":
    health_tests()
    action_tests()
    argocd_cm()
