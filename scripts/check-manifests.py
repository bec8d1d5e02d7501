#!/usr/bin/env python3
"""Checks every Kubernetes manifest in the user pages (README.md and docs/*.md) against the API
server's own OpenAPI schemas for that version, strictly (an unknown or misspelt field is an
error), with kubernetes-validate (PyPI). A manifest is a fenced ```yaml block whose documents
have apiVersion and kind. Kubewarden's own kinds (PolicyServer, ClusterAdmissionPolicy,
AdmissionPolicy) are checked for their apiVersion and the fields this project writes, since their
CRD schemas are not in kubernetes-validate.

Usage: scripts/check-manifests.py [--kubernetes-version 1.31.0] [FILE...]
"""

import argparse
import pathlib
import re
import sys

import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
KUBEWARDEN = {
    "PolicyServer": {
        "spec": {"image", "replicas", "imagePullSecret", "insecureSources", "sourceAuthorities",
                 "env", "annotations", "verificationConfig", "securityContexts", "affinity",
                 "limits", "requests", "minAvailable", "maxUnavailable", "priorityClassName",
                 "serviceAccountName", "tolerations", "namespacedPoliciesCapabilities"},
    },
    "ClusterAdmissionPolicy": {
        "spec": {"policyServer", "module", "mutating", "backgroundAudit", "mode", "rules",
                 "settings", "timeoutSeconds", "timeoutEvalSeconds", "failurePolicy",
                 "namespaceSelector", "objectSelector", "matchPolicy", "sideEffects",
                 "contextAwareResources", "message", "matchConditions"},
    },
}
KUBEWARDEN["AdmissionPolicy"] = KUBEWARDEN["ClusterAdmissionPolicy"]


def manifests(path):
    text = path.read_text()
    for number, block in enumerate(re.findall(r"^```yaml\n(.*?)^```", text, re.S | re.M), 1):
        try:
            documents = list(yaml.safe_load_all(block))
        except yaml.YAMLError as error:
            yield f"{path.name} block {number}", None, f"not YAML: {error}"
            continue
        for document in documents:
            if isinstance(document, dict) and "apiVersion" in document and "kind" in document:
                name = document.get("metadata", {}).get("name", "?")
                yield f"{path.name} block {number} {document['kind']} {name}", document, None


def check_kubewarden(document):
    kind = document["kind"]
    if document["apiVersion"] != "policies.kubewarden.io/v1":
        return [f"apiVersion {document['apiVersion']!r} is not policies.kubewarden.io/v1"]
    unknown = set(document.get("spec", {})) - KUBEWARDEN[kind]["spec"]
    return [f"unknown spec field {field!r}" for field in sorted(unknown)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubernetes-version", default="1.31.0")
    parser.add_argument("files", nargs="*", type=pathlib.Path)
    args = parser.parse_args()
    files = args.files or [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    checked = failed = 0
    for path in files:
        for where, document, problem in manifests(path):
            errors = [problem] if problem else []
            if document is not None and document["kind"] in KUBEWARDEN:
                errors += check_kubewarden(document)
            elif document is not None:
                try:
                    kubernetes_validate.validate(document, args.kubernetes_version, strict=True)
                except kubernetes_validate.ValidationError as error:
                    errors.append(f"{'.'.join(map(str, error.path))}: {error.message}")
                except kubernetes_validate.SchemaNotFoundError as error:
                    errors.append(f"no schema: {error}")
            checked += 1
            for error in errors:
                failed += 1
                print(f"{where}: {error}")
    print(f"check-manifests: {checked} manifests checked against Kubernetes "
          f"{args.kubernetes_version}, {failed} errors")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
