"""The Kubernetes manifests (k8s/README.md), validated offline.

There is no kubectl or kustomize here, so `build()` composes k8s/kustomization.yaml itself and
refuses any kustomize feature it does not implement. Built-in kinds are validated strictly against
the Kubernetes schemas bundled with kubernetes-validate; the RayCluster against KubeRay v1.7.0's
RayCluster CRD schema (its openAPIV3Schema, Apache-2.0), kept in tests/fixtures/kuberay_raycluster_v1.json
with its `description` texts removed — they do not take part in validation.

Each property that matters is a `*_problems(docs)` check returning what is wrong, so a test
asserts the shipped manifests have none *and* that a manifest broken on purpose has some: a check
that cannot fail checks nothing.
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from packaging.version import Version

from actors.catalog import Trait
from actors.profile import AgentProfile, Policies, ProfileError, demo_profile, load_profile
from actors.tools.demo import demo_registry
from gateway.settings import Settings

REPO = Path(__file__).resolve().parents[1]
K8S_DIR = REPO / "k8s"
RAYCLUSTER_SCHEMA = Path(__file__).resolve().parent / "fixtures" / "kuberay_raycluster_v1.json"

# preStop `sleep` exists from 1.29; validate against a release that has it.
K8S_VERSION = "1.31.0"

# The kustomize features build() implements. Anything else in the kustomization is an error.
KUSTOMIZE_KEYS = {"apiVersion", "kind", "resources", "namespace", "labels"}
NAMESPACED_KINDS = {
    "ConfigMap", "Deployment", "HorizontalPodAutoscaler", "NetworkPolicy", "PodDisruptionBudget", "RayCluster",
    "Service",
}

GATEWAY = ("Deployment", "reactgate-gateway")
AGENTS_MOUNT = "/etc/reactgate/agents"
AUTH_SECRET_ENV = "REACTGATE_AUTH_SECRET"
STORE_ENV = "REACTGATE_STORE"
DRAIN_ENV = "REACTGATE_DRAIN_GRACE_S"
DRAIN_MARGIN_S = 5  # process exit after the server's drain deadline
# Env names that hold credentials: they may only come from a Secret.
SECRET_ENV = re.compile(r"SECRET|PASSWORD|TOKEN|API_KEY|DSN", re.IGNORECASE)
# Credential-looking literals; `<placeholder>` values (README examples) are allowed.
SECRET_LITERALS = [
    re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"),                       # OpenAI / Anthropic keys
    re.compile(r"postgres(?:ql)?://[^\s:/@]+:(?!<)[^\s@]+@"),      # DSN with an inline password
    re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"),   # a JWT
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
]
REQUIRED_RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}

# The profile shape (docs/design.md#profiles) as the runtime's model defines it; the demo tools
# (docs/design.md#demo-tools).
PROFILE_KEYS = set(AgentProfile.model_fields)
# What the demo agent states; the other keys (instructions, model settings, MCP servers) are a user
# agent's and optional.
DEMO_PROFILE_KEYS = {"name", "model", "fallbacks", "states", "initial_state", "placement", "policies", "tools"}
POLICY_KEYS = set(Policies.model_fields)
DEMO_TOOLS = {tool.tool_id for tool in demo_registry()}
DEMO_STATES = ["default", "focused"]


# ---------------------------------------------------------------------------------------------
# Composition


def build(k8s_dir: Path = K8S_DIR) -> list[dict[str, Any]]:
    """What `kustomize build k8s_dir` would emit, for the features KUSTOMIZE_KEYS lists."""
    kustomization = yaml.safe_load((k8s_dir / "kustomization.yaml").read_text())
    assert (kustomization["apiVersion"], kustomization["kind"]) == (
        "kustomize.config.k8s.io/v1beta1", "Kustomization")
    unsupported = set(kustomization) - KUSTOMIZE_KEYS
    if unsupported:
        raise NotImplementedError(f"kustomization uses {sorted(unsupported)}: teach build() first")
    docs: list[dict[str, Any]] = []
    for entry in kustomization["resources"]:
        path = k8s_dir / entry
        if not path.is_file():
            raise NotImplementedError(f"resource {entry!r} is not a local file")
        docs.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None)
    for doc in docs:
        metadata = doc.setdefault("metadata", {})
        if "namespace" in kustomization:
            if doc["kind"] not in NAMESPACED_KINDS:
                raise NotImplementedError(f"is {doc['kind']} namespaced? teach build()")
            metadata["namespace"] = kustomization["namespace"]
        for label_set in kustomization.get("labels", []):
            if label_set.get("includeSelectors") or label_set.get("includeTemplates"):
                raise NotImplementedError("labels into selectors/templates: teach build()")
            metadata.setdefault("labels", {}).update(label_set["pairs"])
    return docs


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def gateway_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return find(docs, *GATEWAY)["spec"]["template"]


def gateway_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = gateway_pod(docs)["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def ray_pod_templates(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    spec = find(docs, "RayCluster")["spec"]
    yield spec["headGroupSpec"]["template"]
    for group in spec.get("workerGroupSpecs", []):
        yield group["template"]


def all_containers(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    yield from gateway_pod(docs)["spec"]["containers"]
    for template in ray_pod_templates(docs):
        yield from template["spec"]["containers"]


def autoscaler_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The sidecar KubeRay adds to the head, as far as autoscalerOptions describe it."""
    return {"name": "autoscaler", **find(docs, "RayCluster")["spec"].get("autoscalerOptions", {})}


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def flag(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


def expand(value: str, container: dict[str, Any]) -> str:
    """Kubernetes' `$(NAME)` expansion of a command from the container's literal env values."""
    env = env_of(container)
    return re.sub(r"\$\((\w+)\)", lambda m: str(env.get(m.group(1), {}).get("value", m.group(0))), value)


def resolve_port(container: dict[str, Any], port: int | str) -> int | None:
    """A probe's or Service's port (number or name) as the container port number, if it is one."""
    for p in container.get("ports", []):
        if port in (p["containerPort"], p.get("name")):
            return int(p["containerPort"])
    return None


def demo_profile_text(docs: list[dict[str, Any]]) -> str:
    return str(find(docs, "ConfigMap", "reactgate-agents")["data"]["demo.toml"])


@pytest.fixture(scope="module")
def built() -> list[dict[str, Any]]:
    return build()


@pytest.fixture
def docs(built: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A private copy, free to break."""
    return copy.deepcopy(built)


@pytest.fixture(scope="module")
def raycluster_validator() -> jsonschema.protocols.Validator:
    schema = json.loads(RAYCLUSTER_SCHEMA.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


# ---------------------------------------------------------------------------------------------
# The checks: each returns what is wrong, empty when nothing is.


def drain_problems(docs: list[dict[str, Any]]) -> list[str]:
    pod = gateway_pod(docs)["spec"]
    pre_stop = gateway_container(docs).get("lifecycle", {}).get("preStop", {})
    seconds = pre_stop.get("sleep", {}).get("seconds")
    if not isinstance(seconds, int) or seconds < 1:
        return ["gateway has no preStop sleep to let endpoints drain before SIGTERM"]
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if grace < seconds + 30:
        return [f"grace period {grace}s < preStop {seconds}s + 30s to flush and close clients"]
    # The server's own drain deadline (SIGTERM → 1012 → exit) must end before SIGKILL.
    drain = env_of(gateway_container(docs)).get(DRAIN_ENV, {}).get("value")
    drain_s = float(drain) if drain is not None else Settings.model_fields["drain_grace_s"].default
    if seconds + drain_s + DRAIN_MARGIN_S > grace:
        return [f"preStop {seconds}s + server drain {drain_s}s + {DRAIN_MARGIN_S}s > grace period {grace}s"]
    return []


def secret_problems(docs: list[dict[str, Any]], k8s_dir: Path = K8S_DIR) -> list[str]:
    problems = [f"a Secret object is applied: {d['metadata']['name']}" for d in docs if d["kind"] == "Secret"]
    for container in [*all_containers(docs), autoscaler_container(docs)]:
        for name, entry in env_of(container).items():
            if SECRET_ENV.search(name) and "secretKeyRef" not in entry.get("valueFrom", {}):
                problems.append(f"{container['name']}: {name} is not from a secretKeyRef")
    auth = env_of(gateway_container(docs)).get(AUTH_SECRET_ENV, {}).get("valueFrom", {}).get("secretKeyRef")
    if not auth:
        problems.append(f"gateway binds 0.0.0.0 without {AUTH_SECRET_ENV} from a Secret")
    elif auth.get("optional"):
        problems.append(f"{AUTH_SECRET_ENV} is optional: the gateway would refuse to start without it")
    texts = {p.name: p.read_text() for p in sorted(k8s_dir.rglob("*")) if p.is_file()}
    texts["<built>"] = yaml.safe_dump_all(docs)
    for where, text in texts.items():
        problems += [f"{where}: literal credential {m.group(0)[:12]}…" for rx in SECRET_LITERALS
                     for m in rx.finditer(text)]
    return problems


def store_dsn_problems(docs: list[dict[str, Any]]) -> list[str]:
    """The DSN is the gateway's, from the Secret; the Ray actors get it from the gateway inside their
    configuration, so a Ray container that sets it would be a second, ignored copy of a secret."""
    problems = []
    source = env_of(gateway_container(docs)).get(STORE_ENV, {}).get("valueFrom", {}).get("secretKeyRef")
    if not source or source.get("key") != "store-dsn" or source.get("optional"):
        problems.append(f"gateway does not read {STORE_ENV} from the Secret's store-dsn")
    for template in ray_pod_templates(docs):
        for container in template["spec"]["containers"]:
            if STORE_ENV in env_of(container):
                problems.append(f"{container['name']}: sets {STORE_ENV}; the hosts get it from the gateway")
    return problems


def probe_problems(docs: list[dict[str, Any]]) -> list[str]:
    container = gateway_container(docs)
    serve_port = int(flag(container["command"], "--port") or 0)
    problems = []
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        http = container.get(probe, {}).get("httpGet", {})
        if http.get("path") != path:
            problems.append(f"{probe} does not GET {path}")
        if resolve_port(container, http.get("port", -1)) != serve_port:
            problems.append(f"{probe} does not hit the served port {serve_port}")
    return problems


def service_problems(docs: list[dict[str, Any]]) -> list[str]:
    service = find(docs, "Service", GATEWAY[1])["spec"]
    deployment = find(docs, *GATEWAY)["spec"]
    pod_labels = gateway_pod(docs)["metadata"]["labels"]
    problems = []
    for what, selector in (("Service", service.get("selector", {})),
                           ("Deployment", deployment["selector"].get("matchLabels", {}))):
        if not selector or selector.items() - pod_labels.items():
            problems.append(f"{what} selector {selector} does not select the gateway pods {pod_labels}")
    ws = [p for p in service["ports"] if p.get("name") == "ws"]
    if service.get("type", "ClusterIP") != "ClusterIP" or len(ws) != 1:
        problems.append("gateway Service is not a ClusterIP with one port named ws")
    elif resolve_port(gateway_container(docs), ws[0].get("targetPort", ws[0]["port"])) != 8765:
        problems.append("Service port ws does not reach container port 8765")
    return problems


def disruption_problems(docs: list[dict[str, Any]]) -> list[str]:
    hpa = find(docs, "HorizontalPodAutoscaler")["spec"]
    pdb = find(docs, "PodDisruptionBudget")["spec"]
    pod_labels = gateway_pod(docs)["metadata"]["labels"]
    problems = []
    target = hpa["scaleTargetRef"]
    if (target.get("apiVersion"), target["kind"], target["name"]) != ("apps/v1", *GATEWAY):
        problems.append(f"HPA targets {target}, not the gateway Deployment")
    if (hpa.get("minReplicas"), hpa["maxReplicas"]) != (3, 20):
        problems.append("HPA is not 3..20 replicas")
    cpu = [m for m in hpa.get("metrics", []) if m.get("resource", {}).get("name") == "cpu"]
    if not cpu or cpu[0]["resource"]["target"].get("averageUtilization") != 70:
        problems.append("HPA does not target 70% CPU")
    selector = pdb.get("selector", {}).get("matchLabels", {})
    if not selector or selector.items() - pod_labels.items():
        problems.append(f"PDB selector {selector} does not select the gateway pods")
    # A budget that allows no disruption at the minimum replica count blocks node drains forever.
    if "maxUnavailable" in pdb:
        if pdb["maxUnavailable"] != 1:
            problems.append("PDB maxUnavailable is not 1")
    elif pdb.get("minAvailable") != 2 or hpa.get("minReplicas", 1) <= 2:
        problems.append("PDB minAvailable is not 2 below the minimum replica count")
    return problems


def ray_head_problems(docs: list[dict[str, Any]]) -> list[str]:
    cluster = find(docs, "RayCluster")
    head = cluster["spec"]["headGroupSpec"]
    params = head.get("rayStartParams", {})
    problems = []
    if params.get("num-cpus") != "0":
        problems.append("head does not advertise num-cpus 0: actors could land on it")
    if params.get("include-dashboard") != "false":
        problems.append("head starts the dashboard")
    container = head["template"]["spec"]["containers"][0]
    for name, port in (("gcs-server", 6379), ("client", 10001)):
        if resolve_port(container, name) != port:
            problems.append(f"head has no port {name} {port}")
    return problems


# The gateway pod joins the cluster as a Ray node of its own (k8s/README.md#gateways-and-the-cluster):
# `sh -c SCRIPT reactgate serve …`, the script starting the node and, once it started, exec-ing the server.
JOIN_SCRIPT = re.compile(r'^ray start --address=(\S+) --num-cpus=0 (?:--\S+ )*&& exec "\$0" "\$@"$')


def gateway_join_problems(docs: list[dict[str, Any]]) -> list[str]:
    cluster = find(docs, "RayCluster")
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    gcs = f"{cluster['metadata']['name']}-head-svc:{resolve_port(head, 'gcs-server')}"
    container = gateway_container(docs)
    command = container["command"]
    problems = []
    if command[:2] != ["sh", "-c"] or command[3:5] != ["reactgate", "serve"]:
        return [f"gateway command is not `sh -c SCRIPT reactgate serve …`: {command[:5]}"]
    script = " ".join(command[2].split())
    joined = JOIN_SCRIPT.match(script)
    if joined is None:
        problems.append(f"the gateway pod does not start a Ray node with no CPUs, then exec the server: {script!r}")
    elif expand(joined.group(1), container) != gcs:
        problems.append(f"the gateway's Ray node joins {expand(joined.group(1), container)}, not the head's GCS {gcs}")
    address = expand(flag(command, "--ray-address") or "", container)
    if address != gcs:
        problems.append(f"the gateway's driver joins {address!r}, not the head's GCS {gcs} through its own node")
    return problems


def ray_workers_problems(docs: list[dict[str, Any]]) -> list[str]:
    spec = find(docs, "RayCluster")["spec"]
    problems = []
    if spec.get("enableInTreeAutoscaling") is not True:
        problems.append("Ray in-tree autoscaling is off")
    groups = spec.get("workerGroupSpecs", [])
    if len(groups) != 1 or (groups[0]["minReplicas"], groups[0]["maxReplicas"]) != (1, 10):
        problems.append("not one worker group scaled 1..10")
    gateway_image = gateway_container(docs)["image"]
    for container in all_containers(docs):
        env = env_of(container)
        for name, value in REQUIRED_RAY_ENV.items():
            if env.get(name, {}).get("value") != value:
                problems.append(f"{container['name']}: {name} is not {value!r}")
        # A Ray node (the gateway pod is one) needs the same Ray and Python as the cluster.
        if container["image"] != gateway_image:
            problems.append(f"{container['name']} runs {container['image']}, gateway runs {gateway_image}")
        resources = container.get("resources", {})
        if not {"cpu", "memory"} <= resources.get("requests", {}).keys() & resources.get("limits", {}).keys():
            problems.append(f"{container['name']}: cpu/memory requests and limits not both set")
    return problems


def hardening_problems(docs: list[dict[str, Any]]) -> list[str]:
    pod = gateway_pod(docs)["spec"]
    ctx = {**pod.get("securityContext", {}), **gateway_container(docs).get("securityContext", {})}
    problems = []
    if ctx.get("runAsNonRoot") is not True:
        problems.append("gateway may run as root")
    if ctx.get("readOnlyRootFilesystem") is not True:
        problems.append("gateway root filesystem is writable")
    if ctx.get("allowPrivilegeEscalation") is not False:
        problems.append("gateway allows privilege escalation")
    if ctx.get("capabilities", {}).get("drop") != ["ALL"]:
        problems.append("gateway keeps Linux capabilities")
    annotations = gateway_pod(docs)["metadata"].get("annotations", {})
    wanted = {"prometheus.io/scrape": "true", "prometheus.io/port": "8765", "prometheus.io/path": "/metrics"}
    if wanted.items() - annotations.items():
        problems.append(f"gateway pods lack scrape annotations {wanted}")
    return problems


def settings_env_problems(docs: list[dict[str, Any]]) -> list[str]:
    """A REACTGATE_ variable that is neither a setting nor expanded into the command is a typo:
    pydantic-settings ignores it silently."""
    container = gateway_container(docs)
    command = " ".join(container["command"])
    return [
        f"{name} is not a gateway setting and not used in the command"
        for name in env_of(container)
        if name.startswith("REACTGATE_")
        and name.removeprefix("REACTGATE_").lower() not in Settings.model_fields
        and f"$({name})" not in command
    ]


def profile_problems(docs: list[dict[str, Any]]) -> list[str]:
    try:
        profile = tomllib.loads(demo_profile_text(docs))
    except tomllib.TOMLDecodeError as exc:
        return [f"demo.toml is not TOML: {exc}"]
    problems = []
    if not DEMO_PROFILE_KEYS <= profile.keys() <= PROFILE_KEYS:
        problems.append(f"profile keys {sorted(profile)}: not the demo's {sorted(DEMO_PROFILE_KEYS)}, or unknown ones")
    if profile.get("policies", {}).keys() != POLICY_KEYS:
        problems.append(f"policies keys {sorted(profile.get('policies', {}))} != {sorted(POLICY_KEYS)}")
    if profile.get("states") != DEMO_STATES or profile.get("initial_state") != "default":
        problems.append("demo states are not default/focused starting at default")
    tools = {t["id"]: t for t in profile.get("tools", [])}
    if tools.keys() != DEMO_TOOLS:
        problems.append(f"tools {sorted(tools)} != the demo tools {sorted(DEMO_TOOLS)}")
    for tool_id, tool in tools.items():
        want = ["focused"] if tool_id == "demo.write_note" else None
        if tool.get("states") != want:
            problems.append(f"{tool_id} states {tool.get('states')} != {want or 'all'}")
        if "trait" in tool and tool["trait"] not in set(Trait):
            problems.append(f"{tool_id} trait {tool['trait']!r} is not a trait")
    # The gateway must be pointed at this file through the ConfigMap mount.
    container = gateway_container(docs)
    mounts = [m for m in container.get("volumeMounts", []) if m["mountPath"] == AGENTS_MOUNT]
    volumes = {v["name"]: v for v in gateway_pod(docs)["spec"].get("volumes", [])}
    if flag(container["command"], "--agent") != f"{AGENTS_MOUNT}/demo.toml" or len(mounts) != 1:
        problems.append(f"gateway does not load --agent {AGENTS_MOUNT}/demo.toml from a mount")
    elif volumes.get(mounts[0]["name"], {}).get("configMap", {}).get("name") != "reactgate-agents":
        problems.append(f"{AGENTS_MOUNT} is not the reactgate-agents ConfigMap")
    return problems


def breaking(docs: list[dict[str, Any]], mutate: Callable[[list[dict[str, Any]]], object]) -> list[dict[str, Any]]:
    """A copy of docs with one thing broken: each breakage is checked on its own."""
    broken = copy.deepcopy(docs)
    mutate(broken)
    return broken


# ---------------------------------------------------------------------------------------------
# Composition and schemas


def test_kustomization_composes_the_expected_objects(built: list[dict[str, Any]]) -> None:
    names = sorted((d["kind"], d["metadata"]["name"]) for d in built)
    assert names == [
        ("ConfigMap", "reactgate-agents"),
        ("Deployment", "reactgate-gateway"),
        ("HorizontalPodAutoscaler", "reactgate-gateway"),
        ("NetworkPolicy", "reactgate-gateway"),
        ("NetworkPolicy", "reactgate-ray"),
        ("PodDisruptionBudget", "reactgate-gateway"),
        ("RayCluster", "reactgate"),
        ("Service", "reactgate-gateway"),
    ]
    assert {d["metadata"]["namespace"] for d in built} == {"reactgate"}
    assert all(d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "reactgate" for d in built)


def test_build_refuses_kustomize_features_it_does_not_implement(tmp_path: Path) -> None:
    for path in K8S_DIR.glob("*.yaml"):
        (tmp_path / path.name).write_text(path.read_text())
    kustomization = yaml.safe_load((tmp_path / "kustomization.yaml").read_text())
    kustomization["patches"] = [{"path": "gateway.yaml"}]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    with pytest.raises(NotImplementedError, match="patches"):
        build(tmp_path)


def test_builtin_kinds_validate_strictly(built: list[dict[str, Any]]) -> None:
    assert Version(kubernetes_validate.utils.latest_version()) >= Version(K8S_VERSION)
    builtin = [d for d in built if d["kind"] != "RayCluster"]
    assert len(builtin) == 7
    for doc in builtin:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_strict_validation_rejects_an_unknown_field(docs: list[dict[str, Any]]) -> None:
    gateway_container(docs)["readinesProbe"] = {"httpGet": {"path": "/readyz", "port": "ws"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(find(docs, *GATEWAY), K8S_VERSION, strict=True)


def test_prestop_sleep_needs_kubernetes_1_29_schemas(built: list[dict[str, Any]]) -> None:
    # The sleep action is validated, not waved through: 1.28 schemas do not know it.
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(find(built, *GATEWAY), "1.28.0", strict=True)
    kubernetes_validate.validate(find(built, *GATEWAY), "1.29.0", strict=True)


def test_raycluster_validates_against_kuberay_schema(
    built: list[dict[str, Any]], raycluster_validator: jsonschema.protocols.Validator
) -> None:
    cluster = find(built, "RayCluster")
    assert cluster["apiVersion"] == "ray.io/v1"
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in raycluster_validator.iter_errors(cluster)]
    assert errors == []


def test_kuberay_schema_rejects_an_unknown_field(
    docs: list[dict[str, Any]], raycluster_validator: jsonschema.protocols.Validator
) -> None:
    find(docs, "RayCluster")["spec"]["workerGroupSpecs"][0]["maxReplica"] = 10
    assert not raycluster_validator.is_valid(find(docs, "RayCluster"))


# ---------------------------------------------------------------------------------------------
# Properties


def test_gateway_drains_before_sigterm_within_the_grace_period(docs: list[dict[str, Any]]) -> None:
    assert drain_problems(docs) == []
    assert drain_problems(breaking(docs, lambda d: gateway_pod(d)["spec"].update(
        terminationGracePeriodSeconds=30)))
    assert drain_problems(breaking(docs, lambda d: gateway_container(d).pop("lifecycle")))


def test_server_drain_deadline_fits_the_grace_period(docs: list[dict[str, Any]]) -> None:
    # The env var must name a real setting: pydantic-settings ignores unknown REACTGATE_ vars.
    assert DRAIN_ENV.removeprefix("REACTGATE_").lower() in Settings.model_fields
    assert DRAIN_ENV in env_of(gateway_container(docs))
    assert drain_problems(breaking(docs, lambda d: env_of(gateway_container(d))[DRAIN_ENV].update(value="55")))


def test_secrets_come_only_from_secret_refs(docs: list[dict[str, Any]]) -> None:
    assert secret_problems(docs) == []
    env = env_of(gateway_container(docs))
    assert "secretKeyRef" in env["REACTGATE_STORE"]["valueFrom"]
    assert env["OPENAI_API_KEY"]["valueFrom"]["secretKeyRef"]["optional"] is True
    assert secret_problems(breaking(docs, lambda d: env_of(gateway_container(d))[AUTH_SECRET_ENV].update(
        value="hunter2-hunter2", valueFrom={})))


def test_store_dsn_goes_from_the_secret_to_the_gateway_only(docs: list[dict[str, Any]]) -> None:
    assert store_dsn_problems(docs) == []
    assert store_dsn_problems(breaking(docs, lambda d: find(d, "RayCluster")["spec"]["workerGroupSpecs"][0][
        "template"]["spec"]["containers"][0]["env"].append(
            {"name": STORE_ENV, "valueFrom": {"secretKeyRef": {"name": "reactgate-secrets", "key": "store-dsn"}}})))
    assert store_dsn_problems(breaking(docs, lambda d: gateway_container(d).update(env=[
        e for e in gateway_container(d)["env"] if e["name"] != STORE_ENV])))


def test_auth_secret_is_required_because_the_gateway_binds_all_interfaces(docs: list[dict[str, Any]]) -> None:
    assert flag(gateway_container(docs)["command"], "--host") == "0.0.0.0"
    assert secret_problems(breaking(docs, lambda d: env_of(gateway_container(d))[AUTH_SECRET_ENV]["valueFrom"][
        "secretKeyRef"].update(optional=True)))
    assert secret_problems(breaking(docs, lambda d: gateway_container(d).update(env=[
        e for e in gateway_container(d)["env"] if e["name"] != AUTH_SECRET_ENV])))


def test_no_literal_credentials_anywhere_in_k8s(tmp_path: Path, built: list[dict[str, Any]]) -> None:
    (tmp_path / "leak.yaml").write_text("dsn: postgresql://reactgate:s3cret@db:5432/reactgate\n")
    assert secret_problems(built, tmp_path)
    (tmp_path / "leak.yaml").write_text("dsn: postgresql://reactgate:<password>@db:5432/reactgate\n")
    assert secret_problems(built, tmp_path) == []


def test_probes_hit_readyz_and_healthz_on_the_served_port(docs: list[dict[str, Any]]) -> None:
    assert probe_problems(docs) == []
    assert probe_problems(breaking(docs, lambda d: gateway_container(d)["readinessProbe"]["httpGet"].update(
        path="/healthz", port=9000)))


def test_service_selects_the_gateway_pods(docs: list[dict[str, Any]]) -> None:
    assert service_problems(docs) == []
    assert service_problems(breaking(docs, lambda d: find(d, "Service")["spec"]["selector"].update(
        {"app.kubernetes.io/component": "ray-head"})))


def test_hpa_and_pdb_target_the_gateway(docs: list[dict[str, Any]]) -> None:
    assert disruption_problems(docs) == []
    assert disruption_problems(breaking(docs, lambda d: find(d, "HorizontalPodAutoscaler")["spec"][
        "scaleTargetRef"].update(name="reactgate")))
    assert disruption_problems(breaking(docs, lambda d: find(d, "PodDisruptionBudget")["spec"].update(
        maxUnavailable=0)))


def test_ray_head_hosts_no_actors_and_no_dashboard(docs: list[dict[str, Any]]) -> None:
    assert ray_head_problems(docs) == []
    assert ray_head_problems(breaking(docs, lambda d: find(d, "RayCluster")["spec"]["headGroupSpec"][
        "rayStartParams"].pop("num-cpus")))


def test_gateway_pods_join_the_cluster_as_ray_nodes_without_cpus(docs: list[dict[str, Any]]) -> None:
    assert gateway_join_problems(docs) == []

    def with_cpus(d: list[dict[str, Any]]) -> None:
        command = gateway_container(d)["command"]
        command[2] = command[2].replace("--num-cpus=0", "--num-cpus=1")

    def through_ray_client(d: list[dict[str, Any]]) -> None:
        command = gateway_container(d)["command"]
        command[command.index("--ray-address") + 1] = "ray://reactgate-head-svc:10001"

    assert gateway_join_problems(breaking(docs, with_cpus))
    assert gateway_join_problems(breaking(docs, through_ray_client))


def test_ray_workers_autoscale_and_share_the_gateway_image(docs: list[dict[str, Any]]) -> None:
    assert ray_workers_problems(docs) == []
    assert ray_workers_problems(breaking(docs, lambda d: find(d, "RayCluster")["spec"]["workerGroupSpecs"][0][
        "template"]["spec"]["containers"][0].update(image="rayproject/ray:2.60.0")))


def test_gateway_env_names_real_settings(docs: list[dict[str, Any]]) -> None:
    assert settings_env_problems(docs) == []
    assert settings_env_problems(breaking(docs, lambda d: gateway_container(d)["env"].append(
        {"name": "REACTGATE_DRAIN_GRACE", "value": "25"})))


def test_gateway_runs_unprivileged_and_is_scraped(docs: list[dict[str, Any]]) -> None:
    assert hardening_problems(docs) == []
    assert hardening_problems(breaking(docs, lambda d: gateway_container(d)["securityContext"].update(
        readOnlyRootFilesystem=False)))


def test_agent_profile_has_the_spec_shape_and_is_mounted(docs: list[dict[str, Any]]) -> None:
    assert profile_problems(docs) == []
    assert profile_problems(breaking(docs, lambda d: find(d, "ConfigMap")["data"].update(
        {"demo.toml": demo_profile_text(d).replace('states = ["focused"]\n', "")})))
    assert profile_problems(breaking(docs, lambda d: find(d, "ConfigMap")["data"].update(
        {"demo.toml": demo_profile_text(d).replace('trait = "exploitation"', 'trait = "exploit"')})))


def test_agent_profile_loads_through_the_runtime_loader(docs: list[dict[str, Any]]) -> None:
    registry = demo_registry()
    profile = load_profile(demo_profile_text(docs), known_tools=registry)
    builtin = demo_profile(known_tools=registry)
    # The cluster serves the same demo agent as `reactgate serve` with no flags.
    assert (profile.name, profile.models, profile.states, profile.initial_state) == (
        builtin.name, builtin.models, builtin.states, builtin.initial_state)
    assert profile.policies == builtin.policies
    assert profile.tool_states() == builtin.tool_states()

    def traits(p: AgentProfile) -> dict[str, Trait]:
        catalog = registry.catalog().with_overrides(traits=p.trait_overrides()).restricted_to(p.tool_ids)
        return {decl.tool_id: decl.trait for decl in catalog}

    assert traits(profile) == traits(builtin)
    broken = demo_profile_text(docs).replace("max_iterations = 15", "max_iterations = 0")
    with pytest.raises(ProfileError, match=re.escape("policies.max_iterations")):
        load_profile(broken, known_tools=registry)


def tool_mount_problems(docs: list[dict[str, Any]]) -> list[str]:
    """Every Ray pod runs tools (hosts validate, the tool pool executes): each must see the agent
    profiles and the tool modules beside them at the gateway's path (docs/design.md#your-tools)."""
    problems = []
    for template in ray_pod_templates(docs):
        spec = template["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for container in spec["containers"]:
            mounts = [m for m in container.get("volumeMounts", []) if m["mountPath"] == AGENTS_MOUNT]
            if len(mounts) != 1 or not mounts[0].get("readOnly"):
                problems.append(f"{container['name']}: no read-only mount at {AGENTS_MOUNT}")
            elif volumes.get(mounts[0]["name"], {}).get("configMap", {}).get("name") != "reactgate-agents":
                problems.append(f"{container['name']}: {AGENTS_MOUNT} is not the reactgate-agents ConfigMap")
    return problems


def test_every_ray_pod_sees_the_agents_tool_modules_where_the_gateway_does(docs: list[dict[str, Any]]) -> None:
    assert tool_mount_problems(docs) == []

    def unmount_workers(d: list[dict[str, Any]]) -> None:
        worker = find(d, "RayCluster")["spec"]["workerGroupSpecs"][0]["template"]["spec"]
        worker["containers"][0].pop("volumeMounts")

    assert tool_mount_problems(breaking(docs, unmount_workers)) == ["ray-worker: no read-only mount at /etc/reactgate/agents"]



def ray_auth_problems(docs: list[dict[str, Any]]) -> list[str]:
    """Ray's token authentication: on for the cluster (KubeRay puts the token on every Ray process),
    and the gateways — Ray drivers — present the same Secret's token."""
    problems = []
    auth = find(docs, "RayCluster")["spec"].get("authOptions", {})
    if auth.get("mode") != "token" or not auth.get("secretName"):
        problems.append(f"RayCluster authOptions {auth} is not token mode with a Secret")
    env = env_of(gateway_container(docs))
    if env.get("RAY_AUTH_MODE", {}).get("value") != "token":
        problems.append("gateway: RAY_AUTH_MODE is not token")
    ref = env.get("RAY_AUTH_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef", {})
    if (ref.get("name"), ref.get("key")) != (auth.get("secretName"), "auth_token") or ref.get("optional"):
        problems.append(f"gateway: RAY_AUTH_TOKEN {ref} is not the cluster's Secret key auth_token")
    return problems


def network_problems(docs: list[dict[str, Any]]) -> list[str]:
    """Ray pods: ingress only from this namespace's pods. Gateways: their port from anywhere, the rest
    from the namespace."""
    problems = []
    policies = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
    ray_policy = policies.get("reactgate-ray", {})
    selector = ray_policy.get("podSelector", {}).get("matchExpressions", [])
    covered = {v for e in selector if e.get("key") == "app.kubernetes.io/component" and e.get("operator") == "In"
               for v in e.get("values", [])}
    roles = {t["metadata"]["labels"]["app.kubernetes.io/component"] for t in ray_pod_templates(docs)}
    if not roles <= covered:
        problems.append(f"Ray pods {sorted(roles - covered)} are not under the Ray NetworkPolicy")
    if "Ingress" not in ray_policy.get("policyTypes", []):
        problems.append("the Ray NetworkPolicy does not restrict ingress")
    for rule in ray_policy.get("ingress", []):
        sources = rule.get("from")
        if not sources or any(set(src) != {"podSelector"} for src in sources):
            problems.append(f"a Ray ingress rule admits more than this namespace's pods: {rule}")
    gateway_policy = policies.get("reactgate-gateway", {})
    port = gateway_container(docs)["ports"][0]["containerPort"]
    open_rules = [r for r in gateway_policy.get("ingress", []) if "from" not in r]
    if [[p.get("port") for p in r.get("ports", [])] for r in open_rules] != [[port]]:
        problems.append(f"the gateway NetworkPolicy does not open exactly port {port} to everyone")
    return problems


def test_ray_token_auth_is_on_for_the_cluster_and_the_gateways(docs: list[dict[str, Any]]) -> None:
    assert ray_auth_problems(docs) == []
    assert ray_auth_problems(breaking(docs, lambda d: find(d, "RayCluster")["spec"].pop("authOptions")))

    def drop_gateway_token(d: list[dict[str, Any]]) -> None:
        container = find(d, "Deployment")["spec"]["template"]["spec"]["containers"][0]
        container["env"] = [e for e in container["env"] if e["name"] != "RAY_AUTH_TOKEN"]

    assert ray_auth_problems(breaking(docs, drop_gateway_token))


def test_ray_ports_admit_only_the_namespaces_pods_and_the_gateway_port_is_public(docs: list[dict[str, Any]]) -> None:
    assert network_problems(docs) == []

    def open_ray(d: list[dict[str, Any]]) -> None:
        find(d, "NetworkPolicy", "reactgate-ray")["spec"]["ingress"].append({"ports": [{"port": 10001}]})

    assert network_problems(breaking(docs, open_ray))


def test_the_grafana_dashboard_queries_only_metrics_a_gateway_exports() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from gateway.metrics import GatewayMetrics

    metrics = GatewayMetrics()
    metrics.track(lambda: 0, lambda: 0)
    metrics.delivery_latency.observe(0.01)
    # a labelled family shows samples once a label value exists, as on any gateway that has worked
    metrics.connections_refused.labels(reason="overloaded").inc()
    metrics.frames_in.labels(type="open").inc()
    metrics.errors.labels(code="forbidden").inc()
    exported = {sample.name for family in text_string_to_metric_families(metrics.render().decode())
                for sample in family.samples}
    dashboard = json.loads((K8S_DIR / "grafana-dashboard.json").read_text(encoding="utf-8"))
    queried = {name for p in dashboard["panels"] for t in p["targets"] for name in re.findall(r"reactgate_\w+", t["expr"])}
    assert queried and queried <= exported, sorted(queried - exported)


def test_reactgate_actors_are_placed_only_on_the_worker_group(docs: list[dict[str, Any]]) -> None:
    # An actor asking Ray for no resource stays on its creator's node: the gateway pod's. The hosts,
    # tool pools and Directory ask for a sliver of a resource only the worker group offers.
    env = {e["name"]: e.get("value") for e in gateway_container(docs).get("env", [])}
    resource = env["REACTGATE_RAY_ACTOR_RESOURCE"]
    assert Settings(ray_actor_resource=resource).ray_actor_resource == resource  # a name the gateway accepts
    spec = find(docs, "RayCluster")["spec"]

    def offered(group: dict[str, Any]) -> dict[str, float]:
        raw = group.get("rayStartParams", {}).get("resources")
        return dict(json.loads(json.loads(raw))) if raw else {}  # KubeRay passes it quoted: '"{...}"'

    assert resource not in offered(spec["headGroupSpec"])
    assert spec["workerGroupSpecs"] and all(offered(g).get(resource, 0) >= 1 for g in spec["workerGroupSpecs"])
    assert "--resources" not in " ".join(gateway_container(docs)["command"])  # the gateway's own node offers none


def test_ray_workers_start_the_hosts_at_the_niceness_ray_backend_uses(docs: list[dict[str, Any]]) -> None:
    # Ray starts workers at niceness 15 unless told (RAY_worker_niceness, read by each node's raylet);
    # the hosts are the service, as for a Ray that RayBackend starts itself (actors/ray/config.py).
    from actors.ray.config import WORKER_NICENESS

    def niceness(group: dict[str, Any]) -> set[str | None]:
        return {next((e.get("value") for e in c.get("env", []) if e["name"] == "RAY_worker_niceness"), None)
                for c in group["template"]["spec"]["containers"]}

    groups = find(docs, "RayCluster")["spec"]["workerGroupSpecs"]
    assert groups and all(niceness(g) == {str(WORKER_NICENESS)} for g in groups)
