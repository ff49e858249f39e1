"""deploy/: the Kubernetes manifests validate offline against the Kubernetes schemas, every
flag and CELLACTORS_* variable they hand to ``cellactors serve`` is one serve accepts, the
manifests agree with each other and with the Dockerfile, and the image's entrypoint is a
real console script."""

from __future__ import annotations

import configparser
import importlib
import json
import os
import re
import shlex
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import kubernetes_validate
import pytest
import yaml

from cellactors.cli.app_loader import load_app
from cellactors.cli.listeners import plan_listeners
from cellactors.cli.serve import serve
from cellactors.core import keys
from cellactors.server.app import ServerSettings

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
DOCKERFILE = DEPLOY / "Dockerfile"
KUBERNETES_VERSIONS = ("1.25.0", "1.30.0")  # schema versions kubernetes-validate bundles
SAMPLE_DOWNWARD = {"POD_NAME": "cellactors-0", "POD_IP": "10.0.3.17", "POD_NAMESPACE": "shop"}
SAMPLE_SECRET = "sample-secret-value"
VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


# --- loading -----------------------------------------------------------------------------


def manifest_paths() -> list[Path]:
    """Every Kubernetes manifest under deploy/kubernetes (the kustomization excluded)."""
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    """The non-empty YAML documents of ``path``."""
    with path.open(encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def all_resources() -> list[dict[str, Any]]:
    """Every resource of every manifest."""
    return [doc for path in manifest_paths() for doc in load_yaml_docs(path)]


def resources_of_kind(kind: str) -> list[dict[str, Any]]:
    """The resources of one kind."""
    return [r for r in all_resources() if r["kind"] == kind]


def the_one(kind: str) -> dict[str, Any]:
    """The single resource of ``kind``."""
    found = resources_of_kind(kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def statefulset() -> dict[str, Any]:
    """The fleet's StatefulSet."""
    return the_one("StatefulSet")


def serve_container() -> dict[str, Any]:
    """The container that runs ``cellactors serve``."""
    containers = statefulset()["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def service(name: str) -> dict[str, Any]:
    """The Service called ``name``."""
    found = [s for s in resources_of_kind("Service") if s["metadata"]["name"] == name]
    assert len(found) == 1, f"no Service {name!r}"
    return found[0]


def configmap(name: str) -> dict[str, str]:
    """The data of the ConfigMap called ``name``."""
    found = [c for c in resources_of_kind("ConfigMap") if c["metadata"]["name"] == name]
    assert len(found) == 1, f"no ConfigMap {name!r} in deploy/kubernetes"
    data: dict[str, str] = found[0].get("data", {})
    return data


def container_environment(container: dict[str, Any]) -> dict[str, str]:
    """The environment Kubernetes gives ``container``, with sample values for the downward
    API and Secret references, and the ConfigMaps of ``envFrom`` resolved."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        assert "configMapRef" in source, f"unexpected envFrom source {source}"
        env.update(configmap(source["configMapRef"]["name"]))
    for var in container.get("env", []):
        name = var["name"]
        if "value" in var:
            env[name] = str(var["value"])
        elif "fieldRef" in var.get("valueFrom", {}):
            env[name] = SAMPLE_DOWNWARD[name]
        elif "secretKeyRef" in var.get("valueFrom", {}):
            env[name] = SAMPLE_SECRET
        else:
            raise AssertionError(f"unexpected env source for {name}: {var}")
    return env


def substitute(arg: str, env: dict[str, str]) -> str:
    """Expand ``$(VAR)`` as the kubelet does; an undefined variable fails the test (the
    kubelet would pass it through verbatim)."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in env, f"{arg!r} refers to $({name}), which the container does not define"
        return env[name]

    return VAR_REF.sub(value, arg)


def serve_envvars() -> set[str]:
    """Every environment variable a serve option declares."""
    names: set[str] = set()
    for param in serve.params:
        envvar = getattr(param, "envvar", None)
        if isinstance(envvar, str):
            names.add(envvar)
        elif envvar:
            names.update(envvar)
    return names


def option_for_envvar(name: str) -> click.Parameter:
    """The serve option that reads ``name``."""
    for param in serve.params:
        envvar = getattr(param, "envvar", None)
        if envvar == name or (isinstance(envvar, (list, tuple)) and name in envvar):
            return param
    raise AssertionError(f"no serve option reads {name}")


def flag_names(args: list[str]) -> list[str]:
    """The long flags of an argument list (``--flag=value`` or ``--flag value``)."""
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]


@pytest.fixture
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No CELLACTORS_* variable of the test process leaks into click's parsing."""
    for name in list(os.environ):
        if name.startswith("CELLACTORS_"):
            monkeypatch.delenv(name)
    yield monkeypatch


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a network connection fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def parsed_serve(monkeypatch: pytest.MonkeyPatch) -> click.Context:
    """The serve command line the StatefulSet runs, parsed by click with the container's
    environment (ConfigMap, downward API and Secret samples) in ``os.environ``."""
    container = serve_container()
    env = container_environment(container)
    args = [substitute(a, env) for a in container.get("args", [])]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return serve.make_context("serve", args, resilient_parsing=False)


# --- schema validation ---------------------------------------------------------------------


def test_there_are_manifests() -> None:
    kinds = sorted(r["kind"] for r in all_resources())
    assert kinds == sorted(
        ["ConfigMap", "NetworkPolicy", "PodDisruptionBudget", "Service", "Service", "StatefulSet"]
    )


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(
    "resource",
    [pytest.param(r, id=f"{r['kind']}/{r['metadata']['name']}") for r in all_resources()],
)
def test_manifest_validates_against_kubernetes_schema(
    resource: dict[str, Any], version: str, no_network: None
) -> None:
    """Strict validation (unknown fields are errors) with the bundled, offline schemas."""
    checked = kubernetes_validate.validate(resource, version, strict=True)
    assert checked == version.rsplit(".", 1)[0]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_strict_validation_rejects_a_misspelt_field(version: str, no_network: None) -> None:
    """The validator really checks: a typo in the pod spec is refused, offline."""
    broken = json.loads(json.dumps(statefulset()))
    pod = broken["spec"]["template"]["spec"]
    pod["terminationGracePeriod"] = pod.pop("terminationGracePeriodSeconds")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)
    broken = json.loads(json.dumps(statefulset()))
    broken["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = load_yaml_docs(K8S / "kustomization.yaml")[0]
    assert kustomization["kind"] == "Kustomization"
    listed = kustomization["resources"]
    for entry in listed:
        assert not entry.startswith("/") and ".." not in Path(entry).parts, entry
    assert sorted(listed) == [p.name for p in manifest_paths()]
    images = {i["name"] for i in kustomization.get("images", [])}
    assert serve_container()["image"].split(":")[0] in images


# --- what the manifests pass to `cellactors serve` --------------------------------------------


def test_serve_accepts_the_container_args_and_environment(
    clean_environ: pytest.MonkeyPatch,
) -> None:
    """click parses the StatefulSet's serve command line, with its environment, without
    error (an unknown flag, a bad value or a missing --app would raise)."""
    ctx = parsed_serve(clean_environ)
    params = ctx.params
    data = configmap("cellactors-config")
    assert params["node_id"] == SAMPLE_DOWNWARD["POD_NAME"]
    assert params["bucket"] == data["CELLACTORS_BUCKET"]
    assert params["app"] == tuple(data["CELLACTORS_APP"].split(","))  # --app repeats
    assert params["lease_ttl"] == float(data["CELLACTORS_LEASE_TTL"])
    assert params["access_key_id"] == SAMPLE_SECRET
    assert params["secret_access_key"] == SAMPLE_SECRET
    assert params["bucket"].startswith(("s3://", "gs://")), "a fleet needs a shared bucket"
    # serve's own listener rules (non-loopback public listener, wildcard internal listener).
    listeners = plan_listeners(params["listen"], params["internal_listen"], params["advertise"])
    assert str(listeners.advertise) == f"{SAMPLE_DOWNWARD['POD_IP']}:{listeners.internal.port}"


def test_container_args_are_serve_flags() -> None:
    """Every argument is a ``--flag=value`` of a serve option (no positional leftovers)."""
    args = serve_container().get("args", [])
    assert args, "the StatefulSet passes no flags to serve"
    declared = {opt for p in serve.params for opt in getattr(p, "opts", [])}
    for arg in args:
        assert arg.startswith("--") and "=" in arg, f"write {arg!r} as --flag=value"
        assert arg.split("=", 1)[0] in declared, f"serve has no option {arg.split('=', 1)[0]}"
    assert serve_container().get("command") is None, "the image's entrypoint runs serve"


def test_every_cellactors_variable_is_a_serve_option() -> None:
    """A misspelt CELLACTORS_* variable would be ignored silently by serve."""
    declared = serve_envvars()
    env = container_environment(serve_container())
    names = [n for n in env if n.startswith("CELLACTORS_")]
    assert names
    for name in names:
        assert name in declared, f"{name} is not read by any serve option"
    for name in configmap("cellactors-config"):
        assert name in declared, f"ConfigMap key {name} is not read by any serve option"


def test_no_option_is_set_twice() -> None:
    """A flag in args silently overrides the same option's variable: set each once."""
    container = serve_container()
    from_args = set(flag_names(container.get("args", [])))
    env = container_environment(container)
    for name in env:
        if name.startswith("CELLACTORS_"):
            option = option_for_envvar(name)
            assert not from_args & set(option.opts), f"{name} and {option.opts} both set"


def test_node_ids_from_pod_names_are_valid() -> None:
    """Pod names of the StatefulSet (name-0 ... name-N) are accepted node ids."""
    sts = statefulset()
    assert serve_container()["args"].count("--node=$(POD_NAME)") == 1
    env = {v["name"]: v for v in serve_container()["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    for ordinal in (0, sts["spec"]["replicas"] - 1, 999):
        keys.validate_node_id(f"{sts['metadata']['name']}-{ordinal}")


def test_configmap_app_is_the_one_the_image_ships(clean_environ: pytest.MonkeyPatch) -> None:
    """CELLACTORS_APP names a file the Dockerfile copies into /app, and it loads."""
    app = configmap("cellactors-config")["CELLACTORS_APP"]
    copies = dockerfile_copies()
    assert app in copies, f"{app} is not copied into the image"
    classes = load_app(str(ROOT / copies[app]))
    assert classes


# --- the manifests agree with each other ------------------------------------------------------


def listener_ports(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """The public and internal listener ports from the parsed serve flags."""
    params = parsed_serve(monkeypatch).params
    listeners = plan_listeners(params["listen"], params["internal_listen"], params["advertise"])
    return {"public": listeners.public.port, "internal": listeners.internal.port}


def test_container_ports_match_the_listeners(clean_environ: pytest.MonkeyPatch) -> None:
    ports = {p["name"]: p["containerPort"] for p in serve_container()["ports"]}
    assert ports == listener_ports(clean_environ)


def test_services_route_to_the_right_listeners() -> None:
    sts = statefulset()
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    port_names = {p["name"] for p in serve_container()["ports"]}
    for svc in resources_of_kind("Service"):
        assert svc["spec"]["selector"].items() <= labels.items(), svc["metadata"]["name"]
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in port_names
    peers = service(sts["spec"]["serviceName"])
    assert peers["spec"]["clusterIP"] == "None", "the governing Service must be headless"
    assert [p["targetPort"] for p in peers["spec"]["ports"]] == ["internal"]
    public = service("cellactors-public")
    assert [p["targetPort"] for p in public["spec"]["ports"]] == ["public"]


def test_service_links_are_off() -> None:
    """Service links would inject CELLACTORS_* variables (from the Service names), which
    serve reads as flags."""
    pod = statefulset()["spec"]["template"]["spec"]
    assert pod["enableServiceLinks"] is False


def test_pod_disruption_budget() -> None:
    pdb = the_one("PodDisruptionBudget")
    labels = statefulset()["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_network_policy_keeps_the_internal_port_to_the_fleet() -> None:
    policy = the_one("NetworkPolicy")
    labels = statefulset()["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    for rule in policy["spec"]["ingress"]:
        ports = {p["port"] for p in rule["ports"]}
        if "internal" in ports:
            sources = rule.get("from")
            assert sources, "the internal port must not be open to every source"
            for source in sources:
                assert set(source) == {"podSelector"}
                assert source["podSelector"]["matchLabels"].items() <= labels.items()


def test_probes() -> None:
    """Readiness is /healthz on the public listener; liveness is not /healthz, which answers
    503 while the node drains."""
    container = serve_container()
    ready = container["readinessProbe"]["httpGet"]
    assert ready["path"] == "/healthz"
    assert ready["port"] == "public"
    live = container["livenessProbe"]
    assert live.get("httpGet", {}).get("path") != "/healthz"
    assert "startupProbe" in container


def test_grace_period_covers_the_drain() -> None:
    """preStop pause + a call's timeout + the servers' grace after the drain fit in the
    termination grace period."""
    pod = statefulset()["spec"]["template"]["spec"]
    command = serve_container()["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pause = float(command[1])
    settings = ServerSettings()
    needed = pause + settings.call_timeout + settings.graceful_timeout
    assert pod["terminationGracePeriodSeconds"] >= needed


def test_pod_security_and_resources() -> None:
    pod = statefulset()["spec"]["template"]["spec"]
    container = serve_container()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == dockerfile_user_id() != 0
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind])


def test_writable_paths_are_volumes(clean_environ: pytest.MonkeyPatch) -> None:
    """With a read-only root file system, the data dir and /tmp must be mounted volumes."""
    mounts = {m["mountPath"] for m in serve_container()["volumeMounts"]}
    data_dir = parsed_serve(clean_environ).params["data_dir"]
    assert str(data_dir) in mounts
    assert "/tmp" in mounts


# --- the Dockerfile ----------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def final_stage() -> list[tuple[str, str]]:
    """The instructions of the last build stage."""
    instructions = dockerfile_instructions()
    starts = [i for i, (word, _) in enumerate(instructions) if word == "FROM"]
    return instructions[starts[-1] :]


def dockerfile_copies() -> dict[str, str]:
    """Image path -> repository path, for the final stage's COPY from the build context."""
    copies = {}
    for word, rest in final_stage():
        if word == "COPY" and not rest.startswith("--from"):
            src, dest = shlex.split(rest)
            copies[dest] = src
    return copies


def dockerfile_user_id() -> int:
    """The numeric uid the final stage runs as."""
    users = [rest for word, rest in final_stage() if word == "USER"]
    assert users, "the image must not run as root"
    return int(users[-1].split(":")[0])


def console_scripts() -> dict[str, str]:
    """The console scripts setup.cfg declares: name -> ``module:attr``."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg", encoding="utf-8")
    scripts = {}
    for line in cfg["options.entry_points"]["console_scripts"].strip().splitlines():
        name, _, target = line.partition("=")
        scripts[name.strip()] = target.strip()
    return scripts


def test_dockerfile_entrypoint_is_cellactors_serve() -> None:
    entrypoints = [rest for word, rest in final_stage() if word == "ENTRYPOINT"]
    assert len(entrypoints) == 1
    argv = json.loads(entrypoints[0])  # exec form, so SIGTERM reaches serve directly
    script, *subcommands = argv
    scripts = console_scripts()
    assert script in scripts, f"{script} is not a console script of setup.cfg"
    module_name, _, attr = scripts[script].partition(":")
    command: click.Command = getattr(importlib.import_module(module_name), attr)
    for name in subcommands:
        assert isinstance(command, click.Group), f"{name}: not a subcommand"
        command = command.commands[name]
    assert command is serve


def test_dockerfile_base_user_and_sources() -> None:
    froms = [rest for word, rest in dockerfile_instructions() if word == "FROM"]
    assert all(f.split()[0] == "python:3.11-slim" for f in froms)
    assert dockerfile_user_id() != 0
    assert ("WORKDIR", "/app") in final_stage()
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
    for word, rest in dockerfile_instructions():
        if word == "COPY" and not rest.startswith("--from"):
            *sources, _dest = shlex.split(rest)
            for src in sources:
                assert not src.startswith("/") and ".." not in Path(src).parts, src
                assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
                assert f"!{src.rstrip('/')}" in {ln.rstrip("/") for ln in ignore}, (
                    f"COPY {src}: excluded by Dockerfile.dockerignore"
                )
    for word, rest in final_stage():
        if word == "ENV":
            for name in re.findall(r"(CELLACTORS_[A-Z_]+)=", rest):
                assert name in serve_envvars(), f"ENV {name} is not a serve option"


# --- the documentation -------------------------------------------------------------------------


def test_docs_list_what_the_manifests_set() -> None:
    """docs/kubernetes.md names every ConfigMap variable and container flag, and its links
    point at files of the repository."""
    doc_path = ROOT / "docs" / "kubernetes.md"
    text = doc_path.read_text(encoding="utf-8")
    for name in configmap("cellactors-config"):
        assert f"`{name}`" in text, f"docs/kubernetes.md does not mention {name}"
    for arg in serve_container()["args"]:
        assert f"`{arg}`" in text, f"docs/kubernetes.md does not mention {arg}"
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        assert not re.match(r"[a-z]+:", target), f"link outside the repository: {target}"
        assert (doc_path.parent / target).resolve().is_relative_to(ROOT)
        assert (doc_path.parent / target).exists(), f"broken link {target}"
