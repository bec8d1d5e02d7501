#!/usr/bin/env python3
"""Checks every Kubernetes manifest in the user pages (README.md and docs/*.md) against the API
server's own OpenAPI schemas for that version, strictly (an unknown or misspelt field is an
error), with kubernetes-validate (PyPI). A manifest is a fenced ```yaml block whose documents
have apiVersion and kind. Kubewarden's own kinds (PolicyServer, ClusterAdmissionPolicy,
AdmissionPolicy, ...) are checked against the `openAPIV3Schema` of their CRDs with jsonschema, as
strictly: required fields, enums and types, and no field the schema does not name (unless it
preserves unknown fields, as `spec.settings` does). They are checked against the CRDs of every
release the docs cover, and each release must accept each manifest: Kubewarden 1.38
(scripts/kubewarden-crds-1.38/, the admission-controller chart's, which the docs install) and
1.35 (scripts/kubewarden-crds/, kubewarden-controller v1.35.0). An object given again under the same kind and name must be
given whole (every spec field of its first appearance): `kubectl apply` of a partial copy would
drop the rest. No manifest at all is an error too: the check would prove nothing.

Google Managed Prometheus's kinds (monitoring.googleapis.com/v1: Rules, ClusterRules, GlobalRules,
PodMonitoring, ClusterPodMonitoring) are checked against a structural schema written from their
CRDs (GMP below), as strictly.

A FILE ending in .yaml or .yml (or `-`, standard input) is rendered YAML, such as `kubectl
kustomize deploy/<platform>` prints: every document in it is a manifest, checked the same way,
and a document without apiVersion and kind is an error.

Without FILE arguments it checks the user pages, and also that every manifest a page's section
shows of an installation in deploy/ (SECTIONS below) is what `kubectl kustomize deploy/<platform>`
renders for that object, so that the pages never teach a second, drifting copy.

Usage: scripts/check-manifests.py [--kubernetes-version 1.31.0] [FILE...]
"""

import argparse
import difflib
import pathlib
import re
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Every Kubewarden release whose CRDs must accept the docs' manifests: name -> folder.
RELEASES = {
    "1.38": ROOT / "scripts" / "kubewarden-crds-1.38",
    "1.35": ROOT / "scripts" / "kubewarden-crds",
}


def strict(schema):
    """The CRD's structural schema as JSON Schema that refuses fields it does not name, as the
    API server's pruning and strict field validation (kubectl's default) do."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


def crd_schemas(folder):
    """(apiVersion, kind) -> the strict schema of that served version, from the CRDs in folder."""
    schemas = {}
    paths = sorted(folder.glob("*.yaml"))
    if not paths:
        sys.exit(f"check-manifests: no CRDs in {folder}")
    for path in paths:
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd:
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                if version.get("served"):
                    schema = strict(version["schema"]["openAPIV3Schema"])
                    # metadata is the API server's ObjectMeta, which the CRD leaves undescribed.
                    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
                    schemas[(f"{group}/{version['name']}", kind)] = schema
    return schemas


KUBEWARDEN = {release: crd_schemas(folder) for release, folder in RELEASES.items()}

# Google Cloud Managed Service for Prometheus (monitoring.googleapis.com/v1): no CRD of it is
# vendored here, so its kinds are checked against this structural schema, written from the CRDs
# of GoogleCloudPlatform/prometheus-engine (charts/operator/crds/monitoring.googleapis.com_rules.yaml,
# _clusterrules, _podmonitorings): the fields they name, their types and required fields, and no
# other field (as strict field validation would refuse it). Not checked: the CRDs' CEL rules
# beyond the ones written out below, and PromQL (tests/docs.rs holds the expressions to the
# PrometheusRule's, which promtool tests).
_DURATION = {"type": "string", "minLength": 1,
             "pattern": r"^((\d+)y)?((\d+)w)?((\d+)d)?((\d+)h)?((\d+)m)?((\d+)s)?((\d+)ms)?$"}
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
_GMP_RULE = {
    "type": "object", "required": ["expr"], "additionalProperties": False,
    "properties": {"alert": {"type": "string"}, "record": {"type": "string"},
                   "expr": {"type": "string", "minLength": 1}, "for": _DURATION,
                   "labels": _STRINGS, "annotations": _STRINGS},
    # "Only one of `record` and `alert` must be set"; `for` and `annotations` only with `alert`.
    "oneOf": [{"required": ["alert"]},
              {"required": ["record"], "not": {"anyOf": [{"required": ["for"]},
                                                         {"required": ["annotations"]}]}}],
}
_GMP_RULES_SPEC = {
    "type": "object", "required": ["groups"], "additionalProperties": False,
    "properties": {"groups": {"type": "array", "items": {
        "type": "object", "required": ["interval", "name", "rules"], "additionalProperties": False,
        "properties": {"interval": _DURATION, "name": {"type": "string", "minLength": 1},
                       "rules": {"type": "array", "items": _GMP_RULE}}}}},
}
_SECRET_KEY = {"type": "object", "additionalProperties": False, "properties": {
    "secret": {"type": "object", "required": ["key", "name"], "additionalProperties": False,
               "properties": {"key": {"type": "string"}, "name": {"type": "string"},
                              "namespace": {"type": "string"}}}}}
_GMP_ENDPOINT = {
    "type": "object", "required": ["interval", "port"], "additionalProperties": False,
    "properties": {
        "port": {"anyOf": [{"type": "integer", "minimum": 1},
                           {"type": "string", "minLength": 1, "maxLength": 253}]},
        "interval": _DURATION, "timeout": _DURATION, "path": {"type": "string"},
        "scheme": {"enum": ["http", "https"]}, "proxyUrl": {"type": "string"},
        "params": {"type": "object", "additionalProperties": {"type": "array",
                                                              "items": {"type": "string"}}},
        "metricRelabeling": {"type": "array", "maxItems": 250, "items": {"type": "object"}},
        "authorization": {"type": "object", "additionalProperties": False, "properties": {
            "type": {"type": "string"}, "credentials": _SECRET_KEY}},
        "basicAuth": {"type": "object", "additionalProperties": False, "properties": {
            "username": {"type": "string"}, "password": _SECRET_KEY}},
        "oauth2": {"type": "object"}, "tls": {"type": "object"},
    },
}
_SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "matchLabels": _STRINGS,
    "matchExpressions": {"type": "array", "items": {
        "type": "object", "required": ["key", "operator"], "additionalProperties": False,
        "properties": {"key": {"type": "string"},
                       "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                       "values": {"type": "array", "items": {"type": "string"}}}}}}}
_GMP_MONITORING_SPEC = {
    "type": "object", "required": ["endpoints", "selector"], "additionalProperties": False,
    "properties": {"endpoints": {"type": "array", "minItems": 1, "maxItems": 10,
                                 "items": _GMP_ENDPOINT},
                   "selector": _SELECTOR, "filterRunning": {"type": "boolean"},
                   "limits": {"type": "object"}, "targetLabels": {"type": "object"}},
}


def _gmp(spec, namespaced):
    metadata = {"type": "object", "required": ["name"]}
    if namespaced:
        metadata["required"] = ["name", "namespace"]
    else:
        metadata["properties"] = {"namespace": False}  # cluster-scoped: no namespace
    return {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
            "additionalProperties": False,
            "properties": {"apiVersion": {"const": "monitoring.googleapis.com/v1"},
                           "kind": {"type": "string"}, "metadata": metadata, "spec": spec}}


GMP = {
    "Rules": _gmp(_GMP_RULES_SPEC, namespaced=True),
    "ClusterRules": _gmp(_GMP_RULES_SPEC, namespaced=False),
    "GlobalRules": _gmp(_GMP_RULES_SPEC, namespaced=False),
    "PodMonitoring": _gmp(_GMP_MONITORING_SPEC, namespaced=True),
    "ClusterPodMonitoring": _gmp(_GMP_MONITORING_SPEC, namespaced=False),
}


# The Prometheus operator's kinds (monitoring.coreos.com/v1) and the spec fields their CRDs require.
COREOS_REQUIRED = {"PrometheusRule": ["groups"], "ServiceMonitor": ["endpoints", "selector"],
                   "PodMonitor": ["selector"]}


def check_gmp(document):
    """The errors of a monitoring.googleapis.com object under the structural schema above."""
    schema = GMP.get(document["kind"])
    if schema is None or document["apiVersion"] != "monitoring.googleapis.com/v1":
        return [f"no schema for {document['apiVersion']} {document['kind']} "
                f"(checked: monitoring.googleapis.com/v1 {', '.join(GMP)})"]
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'.'.join(map(str, error.path)) or '(top)'}: {error.message}"
            for error in sorted(validator.iter_errors(document), key=lambda e: list(e.path))]


def rendered(path):
    """The documents of a YAML stream: every one must be a manifest."""
    name = "stdin" if str(path) == "-" else path.name
    text = sys.stdin.read() if str(path) == "-" else path.read_text()
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as error:
        yield name, None, f"not YAML: {error}"
        return
    for number, document in enumerate(documents, 1):
        if document is None:
            continue
        if isinstance(document, dict) and "apiVersion" in document and "kind" in document:
            name_ = document.get("metadata", {}).get("name", "?")
            yield f"{name} document {number} {document['kind']} {name_}", document, None
        else:
            yield f"{name} document {number}", None, "not a manifest (no apiVersion and kind)"


def manifests(path):
    if str(path) == "-" or path.suffix in (".yaml", ".yml"):
        yield from rendered(path)
        return
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


# (page, the heading of its section, the deploy/ overlay whose objects the section shows).
SECTIONS = [
    ("install-eks.md", "# EKS with ECR", "eks-ecr"),
    ("install-gke.md", "# GKE with an Artifact Registry remote repository", "gke-artifact-registry"),
    ("credentials.md", "## A CronJob that renews the Secret (ECR)", "eks-ecr"),
    ("fill-mirror.md", "## The fill controller", "registry"),
    ("fill-mirror.md", "## The fill controller on ECR", "eks-ecr"),
    ("monitoring.md", "# Monitoring", "registry"),
]


def section(text, heading):
    """The text under heading, up to the next heading of its level or above (a shell comment in
    a fenced block is not a heading)."""
    level = heading.split()[0]
    lines = text.splitlines(keepends=True)
    fenced, in_fence = set(), False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            in_fence = not in_fence
        elif in_fence:
            fenced.add(i)
    start = next(i for i, line in enumerate(lines) if line.rstrip("\n") == heading)
    end = next((i for i in range(start + 1, len(lines))
                if i not in fenced and lines[i].startswith("#")
                and len(lines[i].split()[0]) <= len(level)
                and set(lines[i].split()[0]) == {"#"}), len(lines))
    return "".join(lines[start + 1:end])


def render(overlay):
    output = subprocess.run(["kubectl", "kustomize", str(ROOT / "deploy" / overlay)],
                            capture_output=True, text=True, check=True).stdout
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(output) if d}


def check_sections():
    """Errors where a page shows an object of deploy/ otherwise than the overlay renders it."""
    errors, compared, renders = [], 0, {}
    for page, heading, overlay in SECTIONS:
        text = section((ROOT / "docs" / page).read_text(), heading)
        rendered = renders.setdefault(overlay, render(overlay))
        shown = 0
        for block in re.findall(r"^```yaml\n(.*?)^```", text, re.S | re.M):
            for document in yaml.safe_load_all(block):
                if not (isinstance(document, dict) and "kind" in document):
                    continue
                key = (document["kind"], document.get("metadata", {}).get("name"))
                if key not in rendered:
                    continue
                shown += 1
                if document != rendered[key]:
                    errors.append(f"{page} \"{heading}\": {key[0]} {key[1]} is not what "
                                  f"kubectl kustomize deploy/{overlay} renders:\n"
                                  + "".join(difflib.unified_diff(
                                      yaml.safe_dump(rendered[key]).splitlines(keepends=True),
                                      yaml.safe_dump(document).splitlines(keepends=True),
                                      f"deploy/{overlay}", page)))
        if shown == 0:
            errors.append(f"{page} \"{heading}\": shows no object of deploy/{overlay}")
        compared += shown
    return errors, compared


def check_kubewarden(document):
    """The errors of document under each release's CRDs, each named with its release."""
    errors = []
    for release, schemas in KUBEWARDEN.items():
        schema = schemas.get((document["apiVersion"], document["kind"]))
        if schema is None:
            errors.append(f"Kubewarden {release}: apiVersion {document['apiVersion']!r} serves "
                          f"no {document['kind']}")
            continue
        validator = jsonschema.Draft7Validator(schema)
        errors += [f"Kubewarden {release}: {'.'.join(map(str, error.path)) or '(top)'}: "
                   f"{error.message}"
                   for error in sorted(validator.iter_errors(document), key=lambda e: list(e.path))]
    return errors


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubernetes-version", default="1.31.0")
    parser.add_argument("files", nargs="*", type=pathlib.Path)
    args = parser.parse_args()
    files = args.files or [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    checked = failed = 0
    given = {}  # (kind, namespace, name) -> (where, the spec's fields) as first given
    found = {path: list(manifests(path)) for path in files}
    for path in files:
        for where, document, problem in found[path]:
            errors = [problem] if problem else []
            if document is not None and isinstance(document.get("spec"), dict):
                metadata = document.get("metadata", {})
                key = (document["kind"], metadata.get("namespace"), metadata.get("name"))
                if key in given:
                    first, fields = given[key]
                    missing = sorted(fields - set(document["spec"]))
                    if missing:
                        errors.append(f"re-applies the object given at {first} without "
                                      f"spec fields {missing}: applied, it would drop them; "
                                      "give it whole")
                else:
                    given[key] = (where, set(document["spec"]))
            if document is not None and document["apiVersion"].startswith("policies.kubewarden.io/"):
                errors += check_kubewarden(document)
            elif document is not None and document["apiVersion"].startswith("monitoring.googleapis.com/"):
                errors += check_gmp(document)
            elif document is not None and document["apiVersion"].startswith("monitoring.coreos.com/"):
                # The Prometheus operator's kinds have no schema here: their required fields only
                # (tests/deploy_apply.rs applies them under structural schemas of their CRDs).
                required = COREOS_REQUIRED.get(document["kind"])
                if required is None:
                    errors.append(f"no check for monitoring.coreos.com {document['kind']} "
                                  f"(checked: {', '.join(COREOS_REQUIRED)})")
                else:
                    errors += [f"spec.{field} missing" for field in required
                               if not document.get("spec", {}).get(field)]
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
    kubewarden = sum(1 for path in files for _, d, _ in found[path]
                     if d is not None and d["apiVersion"].startswith("policies.kubewarden.io/"))
    if not args.files:
        section_errors, compared = check_sections()
        for error in section_errors:
            failed += 1
            print(error)
        print(f"check-manifests: {compared} manifests of the pages compared with what deploy/ "
              f"renders, {len(section_errors)} differ")
    print(f"check-manifests: {checked} manifests checked ({kubewarden} of Kubewarden's kinds, "
          f"against the CRDs of Kubewarden {' and '.join(RELEASES)}) against Kubernetes "
          f"{args.kubernetes_version}, {failed} errors")
    if checked == 0:
        print("check-manifests: no manifest found: nothing was checked", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
