#!/usr/bin/env python3
"""Offline checks of deploy/: the Kubernetes manifests, the mesh file and the Grafana dashboard.

    python3 deploy/check.py [DEPLOY_DIR]      (default: the directory this file is in)

Run by `cargo test -p sonde --test peers -- deploy::` (crates/sonde/tests/peers/deploy.rs), which also proves
that each check fails on a typo. Needs PyPI's `kubernetes-validate` (which brings `jsonschema`
and `PyYAML`) and Prometheus' `promtool`; `.ci/run` installs them (a venv in target/ci-venv,
Debian's `prometheus`). Nothing here talks to a cluster or the network.

1. Every kustomization (deploy/kubernetes/*/kustomization.yaml) is rendered as `kubectl apply -k`
   would for the features they use (resources, namespace, JSON 6902 patches), and every object
   is validated strictly, so an unknown or misspelt field fails:
   - built-in kinds against the Kubernetes OpenAPI schemas bundled with kubernetes-validate,
     for the oldest and newest Kubernetes versions in KUBERNETES_VERSIONS;
   - the ServiceMonitor against deploy/schemas/servicemonitor.schema.json.
   Every YAML file under deploy/kubernetes must be reached from some kustomization.
   The agents' image comes from an `images:` entry (what `kustomize edit set image` sets), which
   must match the DaemonSet's container. A secretGenerator's file (base/secret.txt, the shared secret) must be gitignored and, when
   present, hold a secret the agents accept; absent (a fresh clone), a placeholder stands in.
2. The ConfigMap's mesh.toml parses as TOML and uses only the keys of docs/mesh.md (the mesh
   contract); MESH_KEYS below follows that file. Each DaemonSet names its agent by address
   (SONDE_MESH_NAME from the downward API: status.podIP, or status.hostIP on hostNetwork), the
   same kind of value as its DNS peers' `target`, so `source` and `target` line up; and runs
   the agent with --quiet and a --max-sessions that serves SIZED_FOR_NODES nodes. A mesh with
   `[peers] kubernetes` (the node-labels overlay) runs as a ServiceAccount with its token
   mounted, bound to the verbs KUBERNETES_RBAC lists (a Role for the EndpointSlices of its
   namespace, a ClusterRole for the nodes), and names a Service that is rendered; one without
   it (DNS or file peers) mounts no token and its ServiceAccount has no RBAC bound. A publisher
   (`sonde mesh publish`, the node-labels overlay) runs as a ServiceAccount granted list and
   watch on the EndpointSlices and nodes, get and update on its ConfigMap (by name), and the
   DaemonSet mounts that ConfigMap where the mesh's [peers] file reads it.
3. Every PromQL expression of deploy/grafana/*.json is checked by `promtool check rules`
   (wrapped as recording rules), and uses only metric names from docs/mesh.md.
4. Every rule file deploy/prometheus/*-rules.yml passes `promtool check rules`, and its unit
   tests (the `*-rules.test.yml` beside it) pass `promtool test rules`.
"""

import base64
import copy
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib

import jsonschema
import kubernetes_validate
import yaml

KUBERNETES_VERSIONS = ["1.29.0", "1.37.0"]

# docs/mesh.md, "The mesh file": table -> keys (None: top level).
MESH_KEYS = {
    None: {"name", "max_link_share", "labels", "peers", "latency", "throughput", "pps", "select"},
    "peers": {"hosts", "file", "name_labels", "dns", "dns_port", "kubernetes", "refresh"},
    "select": {"group", "neighbours", "across", "representatives"},
    "latency": {"protocols", "interval", "timeout", "source_ports", "msg_size", "rate", "session"},
# [throughput] and [pps]: every, jitter, time, and the test's plan keys a mesh takes (sonde's own
# parser checks the values: crates/sonde/tests/peers/deploy.rs runs `sonde server --mesh FILE --check`).
    "throughput": {
        "every", "jitter", "time", "udp", "parallel", "reverse", "bitrate", "length", "protocol",
    },
    "pps": {"every", "jitter", "time", "msg_size", "flows", "gso", "protocol"},
}

# docs/mesh.md, "Peers from the Kubernetes API": the keys of `[peers] kubernetes`.
KUBERNETES_KEYS = {"service", "namespace", "port", "labels", "api_server", "token_file", "ca_file"}

# What `[peers] kubernetes` does on the API server, as (apiGroup, resource): the verbs its
# ServiceAccount needs, and whether cluster-wide (a ClusterRole) or in its namespace (a Role).
# The nodes are read only when `labels` names a node label other than ZONE_KEY (the
# EndpointSlices carry each endpoint's zone themselves).
KUBERNETES_RBAC = {
    ("discovery.k8s.io", "endpointslices"): ({"list", "watch"}, "namespace"),
    ("", "nodes"): ({"list", "watch"}, "cluster"),
}

ZONE_KEY = "topology.kubernetes.io/zone"

# docs/mesh.md, "Metrics" (histograms with the series Prometheus makes of them).
METRICS = {
    "sonde_rtt_seconds_bucket", "sonde_rtt_seconds_sum", "sonde_rtt_seconds_count",
    "sonde_probes_sent_total", "sonde_probes_lost_total", "sonde_peer_up",
    "sonde_throughput_bytes_per_second", "sonde_throughput_timestamp_seconds",
    "sonde_pps_received_per_second", "sonde_pps_timestamp_seconds",
    "sonde_sessions_active", "sonde_sessions_total", "sonde_refusals_total",
    "sonde_served_bytes_total",
    "sonde_tcp_connect_seconds_bucket", "sonde_tcp_connect_seconds_sum",
    "sonde_tcp_connect_seconds_count", "sonde_probes_lost_worst_port_ratio",
    "sonde_probes_worst_source_port", "sonde_mesh_incoming_probers",
    "sonde_mesh_probed_peers", "sonde_mesh_expected_incoming_probers",
    "sonde_mesh_labels", "sonde_mesh_peer_labels", "sonde_mesh_peer_source_up",
    "sonde_mesh_peer_source_peers", "sonde_mesh_peer_source_last_success_timestamp_seconds",
}

# Grafana's interval variables, replaced by a value promtool accepts.
GRAFANA_INTERVALS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}

# The cluster size the DaemonSet's --max-sessions is sized for. Probes take no sessions since
# issue 21 (docs/mesh.md, "Probes"); the rule is kept as headroom for every peer's scheduled
# tests and clients (the former 2 x peers + 2 of probe sessions).
SIZED_FOR_NODES = 128
MIN_MAX_SESSIONS = 2 * (SIZED_FOR_NODES - 1) + 2

# Kinds that are not namespaced (kustomize's `namespace:` leaves them alone).
CLUSTER_KINDS = {"Namespace", "ClusterRole", "ClusterRoleBinding"}


class Failures:
    def __init__(self):
        self.messages = []

    def add(self, where, message):
        self.messages.append(f"{where}: {message}")


def load_yaml_documents(path):
    with open(path, encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def apply_json6902(obj, ops, where, failures):
    """The `add`, `replace` and `remove` operations of RFC 6902, which is what kustomize applies."""
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = obj
        for part in parts[:-1]:
            if isinstance(parent, list):
                part = int(part)
            try:
                parent = parent[part]
            except (KeyError, IndexError, TypeError):
                failures.add(where, f"patch path {op['path']} does not exist")
                return obj
        last = parts[-1]
        if op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(op["value"])
                elif op["op"] == "add":
                    parent.insert(int(last), op["value"])
                else:
                    parent[int(last)] = op["value"]
            else:
                if op["op"] == "replace" and last not in parent:
                    failures.add(where, f"replace of missing {op['path']}")
                parent[last] = op["value"]
        elif op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        else:
            failures.add(where, f"patch op {op['op']} is not one this check applies")
    return obj


# What kustomize's secretGenerator reads, when the file is absent from this checkout (it is
# never committed): the check renders and validates the Secret with this instead.
SECRET_PLACEHOLDER = b"placeholder: make deploy/kubernetes/base/secret.txt\n"

PLACEHOLDERS_NOTED = set()

# A shared secret shorter than this is refused: docs/deploy.md makes one of 32 random bytes.
MIN_SECRET_BYTES = 16


def secret_text_problem(data):
    """Why `data` is not a secret the agents can use (sonde's `Secret::from_text`: one trailing
    line end is not part of it), or None."""
    if data.endswith(b"\n"):
        data = data[:-1]
        if data.endswith(b"\r"):
            data = data[:-1]
    if not data:
        return "is empty: the agent refuses an empty secret"
    if len(data) < MIN_SECRET_BYTES:
        return (
            f"holds {len(data)} bytes, fewer than {MIN_SECRET_BYTES}: make it with "
            "`head -c 32 /dev/urandom | base64 > secret.txt`"
        )
    return None


def ignored_here(kdir, name):
    """Whether the .gitignore next to the kustomization names `name`, so it is never committed."""
    try:
        with open(os.path.join(kdir, ".gitignore"), encoding="utf-8") as f:
            return name in (line.strip() for line in f)
    except FileNotFoundError:
        return False


def generate_secret(kdir, generator, objects, failures):
    """The Secret of a secretGenerator entry (`files: [KEY=PATH]`), named NAME-<hash> as
    kustomize names it (the hash here is a stand-in), and the pod volumes that name it pointed
    at it, as kustomize does."""
    kpath = os.path.join(kdir, "kustomization.yaml")
    name = generator.get("name")
    for key in generator:
        if key not in ("name", "files"):
            failures.add(kpath, f"secretGenerator field {key!r} is not one this check renders")
    data = {}
    for entry in generator.get("files", []):
        key, _, rel = entry.rpartition("=")
        key = key or os.path.basename(rel)
        path = os.path.join(kdir, rel)
        if not ignored_here(kdir, rel):
            failures.add(
                kpath,
                f"secret file {rel} is not in {os.path.join(os.path.basename(kdir), '.gitignore')}: "
                "a secret must never be committed",
            )
        try:
            with open(path, "rb") as f:
                content = f.read()
        except FileNotFoundError:
            if path not in PLACEHOLDERS_NOTED:
                PLACEHOLDERS_NOTED.add(path)
                print(f"note: {os.path.relpath(path)} is absent (it is never committed): the Secret is "
                      "checked with a placeholder; make it before `kubectl apply -k`")
            content = SECRET_PLACEHOLDER
        problem = secret_text_problem(content)
        if problem:
            failures.add(path, f"the shared secret {problem}")
        data[key] = base64.b64encode(content).decode("ascii")
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:10]
    generated = f"{name}-{digest}"
    referenced = 0
    for _, obj in objects:
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        for volume in pod.get("volumes", []):
            if volume.get("secret", {}).get("secretName") == name:
                volume["secret"]["secretName"] = generated
                referenced += 1
    if referenced == 0:
        failures.add(kpath, f"no pod volume names the generated Secret {name}")
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": generated},
        "type": "Opaque",
        "data": data,
    }
    return [(kpath, secret)]


def image_name(image):
    """An image reference without its tag or digest (`registry:5000/sonde:1` -> `registry:5000/sonde`)."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


def set_image(objects, entry):
    """Kustomize's `images:` on every container of a pod template: an image named `name` (any
    tag) becomes `newName` (or the same name) with `newTag` or `digest`. How many it set."""
    hits = 0
    for _, obj in objects:
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            image = container.get("image", "")
            if image_name(image) != entry.get("name"):
                continue
            new = entry.get("newName", entry.get("name"))
            if "digest" in entry:
                new += "@" + entry["digest"]
            elif "newTag" in entry:
                new += ":" + str(entry["newTag"])
            elif image_name(image) != image:
                new += image[len(image_name(image)):]
            container["image"] = new
            hits += 1
    return hits


def render(kdir, failures, reached):
    """The objects `kubectl kustomize kdir` gives, for the kustomization features used here."""
    kpath = os.path.join(kdir, "kustomization.yaml")
    reached.add(os.path.realpath(kpath))
    (kust,) = load_yaml_documents(kpath)
    known = {"apiVersion", "kind", "namespace", "resources", "patches", "secretGenerator", "images"}
    for key in kust:
        if key not in known:
            failures.add(kpath, f"kustomization field {key!r} is not one this check renders")
    objects = []
    for res in kust.get("resources", []):
        path = os.path.normpath(os.path.join(kdir, res))
        if os.path.isdir(path):
            objects.extend(render(path, failures, reached))
        elif os.path.isfile(path):
            reached.add(os.path.realpath(path))
            for doc in load_yaml_documents(path):
                objects.append((path, doc))
        else:
            failures.add(kpath, f"resource {res} does not exist")
    for generator in kust.get("secretGenerator", []):
        objects.extend(generate_secret(kdir, generator, objects, failures))
    for patch in kust.get("patches", []):
        ppath = os.path.join(kdir, patch["path"])
        reached.add(os.path.realpath(ppath))
        (ops,) = load_yaml_documents(ppath)
        target = patch.get("target", {})
        hits = 0
        for i, (src, obj) in enumerate(objects):
            name = obj.get("metadata", {}).get("name")
            if target.get("kind", obj.get("kind")) == obj.get("kind") and target.get("name", name) == name:
                objects[i] = (src, apply_json6902(copy.deepcopy(obj), ops, ppath, failures))
                hits += 1
        if hits == 0:
            failures.add(ppath, f"patch target {target} matches no object")
    for entry in kust.get("images", []):
        if set_image(objects, entry) == 0:
            failures.add(
                kpath,
                f"images entry {entry.get('name')!r} matches no container image, so "
                "`kustomize edit set image` would not set the agents' image",
            )
    if "namespace" in kust:
        for i, (src, obj) in enumerate(objects):
            if obj.get("kind") not in CLUSTER_KINDS:
                obj = copy.deepcopy(obj)
                obj.setdefault("metadata", {})["namespace"] = kust["namespace"]
                objects[i] = (src, obj)
    return objects


def check_object(src, obj, sm_schema, failures):
    where = f"{src} ({obj.get('kind')} {obj.get('metadata', {}).get('name')})"
    if obj.get("kind") == "ServiceMonitor":
        validator = jsonschema.Draft202012Validator(sm_schema)
        for error in validator.iter_errors(obj):
            path = "/".join(str(p) for p in error.absolute_path)
            failures.add(where, f"at /{path}: {error.message}")
        return
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = "/".join(str(p) for p in e.path)
            failures.add(where, f"Kubernetes {version}, at /{path}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            failures.add(where, f"no schema for this kind in Kubernetes {version}: {e}")


def check_mesh(src, text, failures):
    where = f"{src} (mesh.toml)"
    try:
        mesh = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        failures.add(where, f"not TOML: {e}")
        return
    kube = mesh.get("peers", {}).get("kubernetes")
    if kube is not None:
        if not isinstance(kube, dict):
            failures.add(where, "peers.kubernetes must be a table")
        else:
            for sub in kube:
                if sub not in KUBERNETES_KEYS:
                    failures.add(where, f"unknown key peers.kubernetes.{sub} (docs/mesh.md)")
            for key in ("api_server", "token_file", "ca_file"):
                if key in kube:
                    failures.add(
                        where,
                        f"peers.kubernetes.{key} is for tests: in a pod the agent finds the API "
                        "server and its service account's token and CA itself",
                    )
    for key, value in mesh.items():
        if key not in MESH_KEYS[None]:
            failures.add(where, f"unknown top-level key {key!r} (docs/mesh.md)")
        elif key in MESH_KEYS and key is not None:
            if not isinstance(value, dict):
                failures.add(where, f"{key} must be a table")
                continue
            for sub in value:
                if sub not in MESH_KEYS[key]:
                    failures.add(where, f"unknown key {key}.{sub} (docs/mesh.md)")
    peers = mesh.get("peers", {})
    if not any(key in peers for key in ("dns", "kubernetes", "file", "hosts")):
        failures.add(
            where,
            "none of [peers] dns, kubernetes, file or hosts is set: the agents would not find each other",
        )
    return mesh


def grants(rule, group, resource, name=None):
    """The verbs a Role or ClusterRole rule grants on group/resource (on the object `name`, when
    given: a rule with resourceNames grants only on those)."""
    groups = rule.get("apiGroups", [])
    resources = rule.get("resources", [])
    names = rule.get("resourceNames")
    if names is not None and name not in names:
        return set()
    if (group in groups or "*" in groups) and (resource in resources or "*" in resources):
        verbs = set(rule.get("verbs", []))
        return {"get", "list", "watch", "create", "update", "patch"} if "*" in verbs else verbs
    return set()


def bindings_of(objects, sa, ns):
    """The (binding, its role) pairs whose subjects name ServiceAccount ns/sa."""
    roles = {
        (o.get("kind"), o.get("metadata", {}).get("namespace"), o.get("metadata", {}).get("name")): o
        for _, o in objects
        if o.get("kind") in ("Role", "ClusterRole")
    }
    found = []
    for _, binding in objects:
        if binding.get("kind") not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(
            s.get("kind") == "ServiceAccount" and s.get("name") == sa and s.get("namespace", ns) == ns
            for s in binding.get("subjects", [])
        ):
            continue
        ref = binding.get("roleRef", {})
        role_ns = None if ref.get("kind") == "ClusterRole" else binding.get("metadata", {}).get("namespace")
        found.append((binding, roles.get((ref.get("kind"), role_ns, ref.get("name")))))
    return found


def check_grants(where, objects, sa, ns, needed, why, failures):
    """ServiceAccount ns/sa is granted every verb of `needed`: (group, resource) -> (verbs,
    scope, object name or None); alternatives among verbs are written as a tuple."""
    granted = {key: set() for key in needed}
    for binding, role in bindings_of(objects, sa, ns):
        kind = binding.get("kind")
        if role is None:
            ref = binding.get("roleRef", {})
            failures.add(where, f"{kind} {binding['metadata'].get('name')} binds {ref.get('kind')} {ref.get('name')}, which is not rendered here")
            continue
        for (group, resource), (_, scope, name) in needed.items():
            if scope == "cluster" and kind != "ClusterRoleBinding":
                continue
            if scope == "namespace" and kind == "RoleBinding" and binding["metadata"].get("namespace") != ns:
                continue
            for rule in role.get("rules", []):
                granted[(group, resource)] |= grants(rule, group, resource, name)
    for (group, resource), (verbs, scope, name) in needed.items():
        missing = set()
        for verb in verbs:
            alternatives = verb if isinstance(verb, tuple) else (verb,)
            if not granted[(group, resource)] & set(alternatives):
                missing.add(" or ".join(alternatives))
        if missing:
            what = f"{resource}" + (f".{group}" if group else "") + (f" {name}" if name else "")
            place = "cluster-wide (a ClusterRole and ClusterRoleBinding)" if scope == "cluster" else f"in namespace {ns}"
            failures.add(
                where,
                f"ServiceAccount {sa} may not {', '.join(sorted(missing))} {what} {place}: {why}",
            )


def check_kubernetes_access(kdir, objects, mesh, failures):
    """A mesh with [peers] kubernetes: the DaemonSet runs as a ServiceAccount with its token
    mounted, bound to a Role that lists and watches endpointslices in its namespace and (with
    `labels`) a ClusterRole that lists and watches nodes; the Service it names is the one
    rendered here. Without it, no RBAC and no token: DNS and file peers need no API access."""
    kube = mesh.get("peers", {}).get("kubernetes")
    where = os.path.join("kubernetes", os.path.basename(kdir))
    daemonsets = [o for _, o in objects if o.get("kind") == "DaemonSet"]
    if not isinstance(kube, dict):
        for ds in daemonsets:
            pod = ds.get("spec", {}).get("template", {}).get("spec", {})
            if pod.get("automountServiceAccountToken", True):
                failures.add(
                    where,
                    "the DaemonSet mounts a service account token but its mesh uses no API "
                    "([peers] dns or file): set automountServiceAccountToken: false",
                )
            sa = pod.get("serviceAccountName", "default")
            ns = ds.get("metadata", {}).get("namespace")
            for binding, _ in bindings_of(objects, sa, ns):
                failures.add(
                    where,
                    f"{binding.get('kind')} {binding['metadata'].get('name')} grants the agents' "
                    f"ServiceAccount {sa} API access their mesh does not use: the agents need none",
                )
        return
    services = {o.get("metadata", {}).get("name") for _, o in objects if o.get("kind") == "Service"}
    if kube.get("service") not in services:
        failures.add(
            where,
            f"peers.kubernetes.service = {kube.get('service')!r} is not a Service here ({sorted(services)})",
        )
    needed = dict(KUBERNETES_RBAC)
    labels = kube.get("labels") or {}
    if not any(key != ZONE_KEY for key in labels.values()):
        del needed[("", "nodes")]
    accounts = {
        (o.get("metadata", {}).get("namespace"), o.get("metadata", {}).get("name"))
        for _, o in objects
        if o.get("kind") == "ServiceAccount"
    }
    for ds in daemonsets:
        ns = ds.get("metadata", {}).get("namespace")
        pod = ds.get("spec", {}).get("template", {}).get("spec", {})
        sa = pod.get("serviceAccountName")
        if not sa or sa == "default":
            failures.add(where, "the DaemonSet runs as no ServiceAccount of its own (serviceAccountName)")
            continue
        if not pod.get("automountServiceAccountToken", True):
            failures.add(
                where,
                "automountServiceAccountToken is false: [peers] kubernetes reads the service "
                "account's token, CA and namespace from the mounted volume",
            )
        if (ns, sa) not in accounts:
            failures.add(where, f"ServiceAccount {sa} in namespace {ns} is not rendered here")
        if kube.get("namespace", ns) != ns:
            failures.add(
                where,
                f"peers.kubernetes.namespace = {kube.get('namespace')!r}, but the agents run in {ns!r}",
            )
        check_grants(
            where,
            objects,
            sa,
            ns,
            {key: (verbs, scope, None) for key, (verbs, scope) in needed.items()},
            "[peers] kubernetes lists and watches it",
            failures,
        )


def check_publisher(kdir, objects, mesh, failures):
    """`sonde mesh publish` (a Deployment): runs as a ServiceAccount with its token, granted list
    and watch on the EndpointSlices of its namespace and (for a label other than the zone) on
    the nodes, get and update (or patch) on its ConfigMap (create too when the ConfigMap is not
    rendered here); the Service it names is rendered; and the agents read what it writes: the
    DaemonSet mounts that ConfigMap, and the mesh's [peers] file is its key there."""
    where = os.path.join("kubernetes", os.path.basename(kdir))
    for _, dep in objects:
        if dep.get("kind") != "Deployment":
            continue
        pod = dep.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []):
            args = container.get("args", [])
            if args[:2] != ["mesh", "publish"]:
                continue
            name = f"{where} (Deployment {dep['metadata'].get('name')})"
            if dep.get("spec", {}).get("replicas", 1) != 1:
                failures.add(name, "the publisher is the single writer: replicas must be 1")
            service = (flag_values(args, "--service") or ["sonde"])[-1]
            configmap = (flag_values(args, "--configmap") or ["sonde-peers"])[-1]
            key = (flag_values(args, "--key") or ["peers.txt"])[-1]
            labels = dict(l.split("=", 1) for l in flag_values(args, "--label") if "=" in l)
            ns = dep.get("metadata", {}).get("namespace")
            services = {o.get("metadata", {}).get("name") for _, o in objects if o.get("kind") == "Service"}
            if service not in services:
                failures.add(name, f"--service {service} is not a Service here ({sorted(services)})")
            sa = pod.get("serviceAccountName")
            if not sa or sa == "default":
                failures.add(name, "the publisher runs as no ServiceAccount of its own (serviceAccountName)")
                continue
            if not pod.get("automountServiceAccountToken", True):
                failures.add(name, "automountServiceAccountToken is false: the publisher reads its token from it")
            shipped = any(
                o.get("kind") == "ConfigMap" and o.get("metadata", {}).get("name") == configmap
                for _, o in objects
            )
            verbs = {"get", ("update", "patch")} | (set() if shipped else {"create"})
            needed = {
                ("discovery.k8s.io", "endpointslices"): ({"list", "watch"}, "namespace", None),
                ("", "configmaps"): (verbs, "namespace", configmap),
            }
            if any(k != ZONE_KEY for k in labels.values()):
                needed[("", "nodes")] = ({"list", "watch"}, "cluster", None)
            check_grants(name, objects, sa, ns, needed, "sonde mesh publish needs it", failures)
            # The agents read what it writes.
            path = mesh.get("peers", {}).get("file")
            mounted = False
            for _, ds in objects:
                if ds.get("kind") != "DaemonSet":
                    continue
                dpod = ds.get("spec", {}).get("template", {}).get("spec", {})
                volumes = {
                    v.get("name"): v.get("configMap", {}).get("name") for v in dpod.get("volumes", [])
                }
                for c in dpod.get("containers", []):
                    for m in c.get("volumeMounts", []):
                        if volumes.get(m.get("name")) == configmap and path == os.path.join(m.get("mountPath", ""), key):
                            mounted = True
            if not mounted:
                failures.add(
                    name,
                    f"the agents do not read what the publisher writes: no DaemonSet mounts ConfigMap "
                    f"{configmap} where the mesh's [peers] file ({path!r}) is its key {key}",
                )


def check_agent_name(src, obj, failures):
    """SONDE_MESH_NAME is the pod's address (the node's with hostNetwork), as the peers' are."""
    pod = obj.get("spec", {}).get("template", {}).get("spec", {})
    want = "status.hostIP" if pod.get("hostNetwork") else "status.podIP"
    for container in pod.get("containers", []):
        env = {e.get("name"): e for e in container.get("env", [])}
        field = (
            env.get("SONDE_MESH_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        )
        if field != want:
            failures.add(
                src,
                f"container {container.get('name')}: SONDE_MESH_NAME must come from {want} "
                f"(found {field}), so that `source` is an address as the DNS peers' `target` is",
            )


def flag_values(args, flag):
    """Every value of `flag` in a container's args, as `--flag=V` or `--flag V`."""
    values = []
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            values.append(arg[len(flag) + 1:])
        elif arg == flag:
            values.append(args[i + 1] if i + 1 < len(args) else None)
    return values


def check_agent_args(src, obj, failures):
    """The mesh agent's flags docs/mesh.md asks for: room for peers' scheduled tests, --quiet."""
    pod = obj.get("spec", {}).get("template", {}).get("spec", {})
    for container in pod.get("containers", []):
        where = f"{src} (container {container.get('name')})"
        args = [str(a) for a in container.get("args", [])]
        if "--mesh" not in args and not any(a.startswith("--mesh=") for a in args):
            continue
        values = flag_values(args, "--max-sessions")
        try:
            sessions = int(values[-1]) if values else None
        except (TypeError, ValueError):
            sessions = None
            failures.add(where, f"--max-sessions {values[-1]!r} is not a number")
        if sessions is None and not values:
            failures.add(
                where,
                f"no --max-sessions: the default 16 lets 16 peers' scheduled tests or clients "
                f"in at once, and the next is refused (set at least {MIN_MAX_SESSIONS}, "
                f"for {SIZED_FOR_NODES} nodes)",
            )
        elif sessions is not None and sessions < MIN_MAX_SESSIONS:
            failures.add(
                where,
                f"--max-sessions {sessions} is below {MIN_MAX_SESSIONS}, the headroom "
                f"{SIZED_FOR_NODES} nodes' scheduled tests and clients need (probes take no "
                f"session, docs/mesh.md)",
            )
        if "--quiet" not in args:
            failures.add(where, "no --quiet: every test session would be a log line at both ends")


def dashboard_exprs(node):
    if isinstance(node, dict):
        if isinstance(node.get("expr"), str):
            yield node["expr"]
        for value in node.values():
            yield from dashboard_exprs(value)
    elif isinstance(node, list):
        for value in node:
            yield from dashboard_exprs(value)


def check_dashboard(path, failures, promtool):
    with open(path, encoding="utf-8") as f:
        try:
            dashboard = json.load(f)
        except json.JSONDecodeError as e:
            failures.add(path, f"not JSON: {e}")
            return 0
    exprs = list(dashboard_exprs(dashboard.get("panels", [])))
    if not exprs:
        failures.add(path, "no PromQL expression in any panel")
    # The dashboard's own custom variables, at their current value (the datasource variable
    # appears in no expression).
    custom = {}
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "custom":
            value = (var.get("current") or {}).get("value")
            if not value:
                failures.add(path, f"custom variable {var.get('name')!r} has no current value")
                continue
            custom["$" + var["name"]] = value
            custom["${" + var["name"] + "}"] = value
    rules = []
    for i, expr in enumerate(exprs):
        for var, value in list(GRAFANA_INTERVALS.items()) + sorted(custom.items(), key=lambda kv: -len(kv[0])):
            expr = expr.replace(var, value)
        if "$" in expr:
            failures.add(path, f"a Grafana variable this check cannot substitute: {expr}")
        for name in set(re.findall(r"\bsonde_[a-z_]+\b", expr)):
            if name not in METRICS:
                failures.add(path, f"metric {name} is not in docs/mesh.md: {expr}")
        rules.append({"record": f"sonde_dashboard:expr_{i}", "expr": expr})
    with tempfile.TemporaryDirectory() as tmp:
        rules_file = os.path.join(tmp, "dashboard-rules.yml")
        with open(rules_file, "w", encoding="utf-8") as f:
            yaml.safe_dump({"groups": [{"name": "sonde-dashboard", "rules": rules}]}, f)
        out = subprocess.run([promtool, "check", "rules", rules_file], capture_output=True, text=True)
        if out.returncode != 0:
            failures.add(path, f"promtool check rules failed:\n{out.stdout}{out.stderr}")
    return len(exprs)


def main():
    deploy = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(__file__))
    kube = os.path.join(deploy, "kubernetes")
    failures = Failures()
    with open(os.path.join(deploy, "schemas", "servicemonitor.schema.json"), encoding="utf-8") as f:
        sm_schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(sm_schema)

    reached = set()
    kustomizations = sorted(
        d for d in os.listdir(kube) if os.path.isfile(os.path.join(kube, d, "kustomization.yaml"))
    )
    checked = 0
    for kdir in kustomizations:
        objects = render(os.path.join(kube, kdir), failures, reached)
        kinds = sorted(o.get("kind", "?") for _, o in objects)
        for src, obj in objects:
            check_object(os.path.relpath(src, deploy), obj, sm_schema, failures)
            if obj.get("kind") == "ConfigMap" and "mesh.toml" in obj.get("data", {}):
                mesh = check_mesh(os.path.relpath(src, deploy), obj["data"]["mesh.toml"], failures)
                if mesh is not None:
                    check_kubernetes_access(os.path.join(kube, kdir), objects, mesh, failures)
                    check_publisher(os.path.join(kube, kdir), objects, mesh, failures)
            if obj.get("kind") == "DaemonSet":
                check_agent_name(os.path.relpath(src, deploy), obj, failures)
                check_agent_args(os.path.relpath(src, deploy), obj, failures)
            checked += 1
        print(f"kubernetes/{kdir}: {len(objects)} objects ({', '.join(kinds)})")
    for root, _, files in os.walk(kube):
        for name in files:
            path = os.path.realpath(os.path.join(root, name))
            if name.endswith((".yaml", ".yml")) and path not in reached:
                failures.add(os.path.relpath(path, deploy), "not reached from any kustomization, so never checked")

    promtool = shutil.which("promtool") or "promtool"
    grafana = os.path.join(deploy, "grafana")
    exprs = 0
    for name in sorted(os.listdir(grafana)):
        if name.endswith(".json"):
            exprs += check_dashboard(os.path.join(grafana, name), failures, promtool)

    prometheus = os.path.join(deploy, "prometheus")
    rule_files = 0
    for name in sorted(os.listdir(prometheus)) if os.path.isdir(prometheus) else []:
        path = os.path.join(prometheus, name)
        if name.endswith("-rules.yml"):
            rule_files += 1
            out = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True)
            if out.returncode != 0:
                failures.add(path, f"promtool check rules failed:\n{out.stdout}{out.stderr}")
            test = path.removesuffix(".yml") + ".test.yml"
            if not os.path.isfile(test):
                failures.add(path, f"no unit tests ({os.path.basename(test)})")
                continue
            out = subprocess.run(
                [promtool, "test", "rules", os.path.basename(test)],
                capture_output=True, text=True, cwd=prometheus,
            )
            if out.returncode != 0:
                failures.add(test, f"promtool test rules failed:\n{out.stdout}{out.stderr}")

    if failures.messages:
        # A base reached from several kustomizations fails once.
        for message in dict.fromkeys(failures.messages):
            print(f"FAIL {message}", file=sys.stderr)
        sys.exit(1)
    print(
        f"ok: {checked} objects validated strictly, {exprs} PromQL expressions checked by promtool, "
        f"{rule_files} rule files checked and tested by promtool"
    )


if __name__ == "__main__":
    main()
