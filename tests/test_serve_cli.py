"""``cellactors serve`` as a real process: flag checks, the embedded default store, the
start-up probe, and bad inputs over HTTP (which must write nothing to the bucket)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cellactors.persistence.store.embedded import SeaweedServer, free_port
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.persistence.store.spec import ACCEPTED_FORMS
from tests.helpers.fleet import COUNTER_APP, NodeProc, cell_keys, write_app
from tests.helpers.s3_fake import running_fake
from tests.helpers.stores import make_s3_bucket

CLI = [sys.executable, "-m", "cellactors.cli", "serve"]


JSON_HEADERS = {"content-type": "application/json"}


def run_serve(
    args: list[str], cwd: Path, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run ``cellactors serve`` expecting it to exit by itself (a refusal)."""
    return subprocess.run(
        [*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[NodeProc]]:
    """Node processes started by a test; killed at teardown whatever happened."""
    started: list[NodeProc] = []
    yield started
    for node in started:
        node.kill()


# --------------------------------------------------------------------------- flags


def test_public_listener_off_loopback_needs_internal_listen(tmp_path: Path) -> None:
    res = run_serve(["--app", str(COUNTER_APP), "--listen", f"0.0.0.0:{free_port()}"], tmp_path)
    assert res.returncode == 2, res.stderr
    assert "--internal-listen" in res.stderr
    assert not (tmp_path / "cellactors-data").exists()  # refused before touching anything


def test_advertise_wildcard_refused(tmp_path: Path) -> None:
    res = run_serve(
        ["--app", str(COUNTER_APP), "--internal-listen", f"0.0.0.0:{free_port()}"], tmp_path
    )
    assert res.returncode == 2
    assert "--advertise" in res.stderr
    res = run_serve(["--app", str(COUNTER_APP), "--advertise", "0.0.0.0:9000"], tmp_path)
    assert res.returncode == 2
    assert "0.0.0.0" in res.stderr


def test_bad_listen_address(tmp_path: Path) -> None:
    res = run_serve(["--app", str(COUNTER_APP), "--listen", "localhost"], tmp_path)
    assert res.returncode == 2
    assert "HOST:PORT" in res.stderr


@pytest.mark.parametrize("spec", ["az://box/x", "file:///tmp/b", "mybucket"])
def test_bad_bucket_spec_names_accepted_forms(tmp_path: Path, spec: str) -> None:
    res = run_serve(["--app", str(COUNTER_APP), "--bucket", spec], tmp_path)
    assert res.returncode == 2, res.stderr
    assert ACCEPTED_FORMS in res.stderr


def test_bad_bucket_spec_from_environment(tmp_path: Path) -> None:
    env_run = subprocess.run(
        CLI,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={
            **os.environ,
            "CELLACTORS_APP": str(COUNTER_APP),
            "CELLACTORS_BUCKET": "az://nope",
        },
    )
    assert env_run.returncode == 2
    assert ACCEPTED_FORMS in env_run.stderr


def test_gcs_bucket_with_s3_endpoint_refused(tmp_path: Path) -> None:
    res = run_serve(
        ["--app", str(COUNTER_APP), "--bucket", "gs://some-bucket", "--endpoint", "http://x:1"],
        tmp_path,
    )
    assert res.returncode == 2
    assert "GCS" in res.stderr


def test_app_without_cells_refused(tmp_path: Path) -> None:
    empty = tmp_path / "nocells.py"
    empty.write_text("X = 1\n")
    res = run_serve(["--app", str(empty)], tmp_path)
    assert res.returncode == 2
    assert "no CellActor subclass" in res.stderr


def test_app_that_fails_to_import_refused(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere_42\n")
    res = run_serve(["--app", str(broken)], tmp_path)
    assert res.returncode == 2
    assert "import failed" in res.stderr and "not_a_module_anywhere_42" in res.stderr
    res = run_serve(["--app", "no.such.module"], tmp_path)
    assert res.returncode == 2
    assert "no.such.module" in res.stderr
    res = run_serve(["--app", str(tmp_path / "missing.py")], tmp_path)
    assert res.returncode == 2
    assert "no such file" in res.stderr


def test_app_as_module_name(tmp_path: Path, sw_bucket: S3Bucket, seaweed: SeaweedServer) -> None:
    """``--app pkg.mod`` imports from the working directory, like ``python -m``."""
    pkg = tmp_path / "myapp"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cells.py").write_text(COUNTER_APP.read_text())
    node = NodeProc(
        "modnode", Path("myapp.cells"), tmp_path, f"s3://{sw_bucket.bucket}", seaweed.endpoint
    )
    node.start()
    try:
        node.ready()
        resp = httpx.post(node.public_url + "/cells/Counter/m/increment", json={"name": "x"})
        assert resp.json() == {"result": 1}
        node.signal(signal.SIGTERM)
        assert node.wait(30) == 0
    finally:
        node.kill()


# --------------------------------------------------------------------------- stores


def test_embedded_default_store(tmp_path: Path, nodes: list[NodeProc]) -> None:
    """No --bucket: an embedded SeaweedFS under ./cellactors-data, a loud warning, and a
    working, durable counter across a restart."""
    node = NodeProc("solo", COUNTER_APP, tmp_path)
    node.extra = ["--data-dir", str(tmp_path / "cellactors-data")]
    nodes.append(node)
    node.start().ready(60)
    url = node.public_url + "/cells/Counter/a/increment"
    # what the README tells people to type: curl -X POST ... -d '{"name":"x"}'
    assert httpx.post(url, json={"name": "x"}).json() == {"result": 1}
    assert httpx.post(url, json={"name": "x"}).json() == {"result": 2}
    assert httpx.post(url, json={"name": "y", "by": 5}).json() == {"result": 5}
    node.signal(signal.SIGTERM)
    assert node.wait(30) == 0
    out = node.output()
    assert "WARNING" in out and "NOT a fleet" in out
    assert (tmp_path / "cellactors-data" / "store").is_dir()

    node.start().ready(60)  # same data dir: the store and the counts survive
    assert httpx.post(url, json={"name": "x"}).json() == {"result": 3}
    node.signal(signal.SIGTERM)
    assert node.wait(30) == 0


def test_a_node_whose_port_was_taken_before_it_started_moves_to_free_ports(
    tmp_path: Path, seaweed: SeaweedServer, nodes: list[NodeProc]
) -> None:
    # What a parallel test run does: another process binds the port picked for this node.
    bucket = make_s3_bucket(seaweed.endpoint)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        node = NodeProc("moved", COUNTER_APP, tmp_path, f"s3://{bucket.bucket}", seaweed.endpoint)
        node.public_port = taken
        nodes.append(node)
        node.start().ready()
        assert node.public_port != taken and node.starts == 2
        assert "cannot listen" in (tmp_path / "moved.1.log").read_text()
        resp = httpx.post(node.public_url + "/cells/Counter/a/increment", json={"name": "x"})
        assert resp.json() == {"result": 1}


def test_serve_refuses_store_that_fails_probe(tmp_path: Path) -> None:
    with running_fake("ignore") as fake:
        fake.create_bucket("lax")
        res = run_serve(
            [
                "--app",
                str(COUNTER_APP),
                "--bucket",
                "s3://lax",
                "--endpoint",
                fake.endpoint,
                "--internal-listen",
                f"127.0.0.1:{free_port()}",
                "--listen",
                f"127.0.0.1:{free_port()}",
            ],
            tmp_path,
        )
        assert res.returncode == 2, res.stderr
        assert "probe" in res.stderr and "not enforced" in res.stderr
        # refused before taking a lease or creating the fleet key
        assert not any(k.startswith(("nodes/", "fleet/")) for k in fake.objects("lax"))


# --------------------------------------------------------------------------- HTTP inputs


def test_bad_inputs_over_http_write_nothing(
    tmp_path: Path, seaweed: SeaweedServer, nodes: list[NodeProc]
) -> None:
    bucket = make_s3_bucket(seaweed.endpoint)
    node = NodeProc("web", write_app(tmp_path), tmp_path, f"s3://{bucket.bucket}", seaweed.endpoint)
    node.extra = ["--max-body-bytes", "2048"]
    nodes.append(node)
    node.start().ready()
    base = node.public_url + "/cells"

    def cells() -> list[str]:
        return sorted(o.key for o in bucket.list("cells/"))

    before = cells()
    with httpx.Client(timeout=10) as http:
        r = http.post(f"{base}/Nope/a/get", json={})
        assert r.status_code == 404 and r.json()["error"] == "unknown_cell"
        r = http.post(f"{base}/Ledger/a/nope", json={})
        assert r.status_code == 404 and r.json()["error"] == "unknown_method"
        r = http.post(f"{base}/Ledger/a/_private", json={})
        assert r.status_code == 404
        r = http.post(f"{base}/Ledger/a/on_activate", json={})
        assert r.status_code == 404
        r = http.post(f"{base}/Ledger/a%20b/append", json={"entry": "x"})
        assert r.status_code == 400 and r.json()["error"] == "bad_request"
        r = http.post(f"{base}/Ledger/..%2F..%2Fnodes/append", json={"entry": "x"})
        assert r.status_code in (400, 404)
        r = http.post(f"{base}/Ledger/big/echo", json={"data": "x" * 5000})
        assert r.status_code == 413
        r = http.post(f"{base}/Ledger/a/append", content=b"{not json", headers=JSON_HEADERS)
        assert r.status_code == 400
        r = http.post(f"{base}/Ledger/a/append", content=b"[1, 2]", headers=JSON_HEADERS)
        assert r.status_code == 400
        r = http.get(f"{base}/Ledger/a/append")
        assert r.status_code == 405
    assert cells() == before, "a refused call wrote to the bucket"

    # A method that raises: rolled back, 422, and no batch for it.
    with httpx.Client(timeout=10) as http:
        assert http.post(f"{base}/Ledger/f/append", json={"entry": "ok"}).status_code == 200
        keys_before = cell_keys(bucket, "Ledger:f")
        r = http.post(f"{base}/Ledger/f/fail", json={"message": "nope"})
        assert r.status_code == 422
        body = r.json()
        assert body["error"] == "method_failed" and body["type"] == "ValueError"
        assert cell_keys(bucket, "Ledger:f") == keys_before
        r = http.post(f"{base}/Ledger/f/entries", json={})
        assert r.json() == {"result": ["ok"]}
    node.signal(signal.SIGTERM)
    assert node.wait(30) == 0


# --------------------------------------------------------------------------- in-process


def test_load_app_from_file_never_shadows_a_module(tmp_path: Path) -> None:
    import json

    from cellactors.cli.app_loader import load_app

    shadow = tmp_path / "json.py"
    shadow.write_text(COUNTER_APP.read_text())
    classes = load_app(str(shadow))
    assert [c.__name__ for c in classes] == ["Counter"]
    assert sys.modules["json"] is json
    assert {"increment", "get"} <= classes[0].exposed_methods()


def test_a_sibling_of_the_app_file_never_shadows_an_installed_package(tmp_path: Path) -> None:
    """A ``uvicorn.py`` (here ``httpx.py``) beside the app must not replace the installed
    package; other siblings still import. In a fresh interpreter, so nothing is imported."""
    (tmp_path / "app.py").write_text(COUNTER_APP.read_text())
    (tmp_path / "sibling_probe.py").write_text("SIBLING = True\n")
    (tmp_path / "httpx.py").write_text("raise RuntimeError('the shadow ran')\n")
    probe = (
        "from cellactors.cli.app_loader import load_app\n"
        f"load_app({str(tmp_path / 'app.py')!r})\n"
        "import httpx, sibling_probe\n"
        "print(httpx.__file__, sibling_probe.SIBLING)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "site-packages" in out and out.strip().endswith("True"), out


def test_load_app_skips_imported_cell_classes(tmp_path: Path) -> None:
    from cellactors.cli.app_loader import load_app
    from cellactors.errors import ConfigError

    only_imports = tmp_path / "reexport.py"
    only_imports.write_text("from cellactors import CellActor\n")
    with pytest.raises(ConfigError, match="no CellActor subclass"):
        load_app(str(only_imports))


@pytest.mark.parametrize(
    ("listen", "internal", "advertise", "problem"),
    [
        ("0.0.0.0:8080", None, None, "--internal-listen"),
        ("10.0.0.5:8080", None, None, "--internal-listen"),
        ("127.0.0.1:8080", "0.0.0.0:8081", None, "--advertise"),
        ("127.0.0.1:8080", None, "0.0.0.0:8081", "0.0.0.0"),
        ("127.0.0.1:8080", "127.0.0.1:8080", None, "both"),
        ("127.0.0.1:99999", None, None, "out of range"),
        ("127.0.0.1:8080", "127.0.0.1:0", None, "port"),
    ],
)
def test_listener_rules(
    listen: str, internal: str | None, advertise: str | None, problem: str
) -> None:
    from cellactors.cli.listeners import StartupError, plan_listeners

    with pytest.raises(StartupError, match=problem):
        plan_listeners(listen, internal, advertise)


def test_listener_defaults_and_advertise() -> None:
    from cellactors.cli.listeners import plan_listeners

    plan = plan_listeners("127.0.0.1:8080", None, None)
    assert str(plan.internal) == str(plan.advertise) == "127.0.0.1:8081"
    plan = plan_listeners("0.0.0.0:8080", "0.0.0.0:9000", "10.1.2.3:9000")
    assert str(plan.advertise) == "10.1.2.3:9000"
    assert str(plan_listeners("[::1]:8080", None, None).public) == "[::1]:8080"


def test_the_python_api_listens_on_loopback_by_default_as_the_command_does() -> None:
    """Nothing is open to other machines unless asked: the Runner and serve_node defaults
    match ``cellactors serve``'s (docs/http-api.md)."""
    import inspect

    from cellactors.cli.listeners import DEFAULT_INTERNAL, DEFAULT_LISTEN
    from cellactors.server.runner import Runner, serve_node

    for api in (Runner, serve_node):
        params = inspect.signature(api).parameters
        public, internal = params["public"].default, params["internal"].default
        assert f"{public[0]}:{public[1]}" == DEFAULT_LISTEN
        assert f"{internal[0]}:{internal[1]}" == DEFAULT_INTERNAL
