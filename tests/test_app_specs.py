"""``--app`` beyond one module: a package (its submodules all imported), several modules
(the option repeated, or a comma list), and a directory that is not a package refused."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from cellactors.cli.app_loader import absolute_spec, load_app
from cellactors.errors import ConfigError
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.fleet import COUNTER_APP, NodeProc

GREETER = """
from cellactors import CellActor


class Greeter(CellActor):
    def hello(self, name):
        return f"hello {name}"
"""

NOTE = """
from cellactors import CellActor


class Note(CellActor):
    def read(self):
        return "note"
"""


def _package(root: Path, name: str = "shop") -> Path:
    """A package whose cells live in a submodule and a sub-package, none in __init__."""
    pkg = root / name
    (pkg / "more").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "counting.py").write_text(COUNTER_APP.read_text())
    (pkg / "more" / "__init__.py").write_text("")
    (pkg / "more" / "greeting.py").write_text(GREETER)
    return pkg


def _names(spec: str) -> list[str]:
    return [cls.__name__ for cls in load_app(spec)]


def test_a_package_directory_serves_the_cells_of_every_submodule(tmp_path: Path) -> None:
    pkg = _package(tmp_path, "shop_dir")
    assert _names(str(pkg)) == ["Counter", "Greeter"]


def test_several_modules_as_a_comma_list(tmp_path: Path) -> None:
    (tmp_path / "notes_app.py").write_text(NOTE)
    spec = f"{COUNTER_APP}, {tmp_path / 'notes_app.py'}"
    assert _names(spec) == ["Counter", "Note"]
    assert absolute_spec("a.b,rel/app.py") == f"a.b,{Path('rel/app.py').resolve()}"


def test_a_directory_without_init_is_refused(tmp_path: Path) -> None:
    (tmp_path / "loose").mkdir()
    (tmp_path / "loose" / "cells.py").write_text(GREETER)
    with pytest.raises(ConfigError, match="must be a package"):
        load_app(str(tmp_path / "loose"))


def test_the_same_class_name_in_two_modules_is_refused(tmp_path: Path) -> None:
    (tmp_path / "counter_copy.py").write_text(COUNTER_APP.read_text())
    with pytest.raises(ConfigError, match="two cell classes are named Counter"):
        load_app(f"{COUNTER_APP},{tmp_path / 'counter_copy.py'}")


def test_openapi_takes_a_repeated_app(tmp_path: Path) -> None:
    (tmp_path / "notes_app.py").write_text(NOTE)
    args = ["openapi", "--app", str(COUNTER_APP), "--app", str(tmp_path / "notes_app.py")]
    proc = subprocess.run(
        [sys.executable, "-m", "cellactors.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "/cells/Counter/" in proc.stdout and "/cells/Note/" in proc.stdout


def test_serve_a_package_by_name_and_a_second_app_file(
    tmp_path: Path, sw_bucket: S3Bucket, seaweed: SeaweedServer
) -> None:
    _package(tmp_path)
    (tmp_path / "notes_app.py").write_text(NOTE)
    node = NodeProc(
        "pkgnode",
        Path("shop"),
        tmp_path,
        f"s3://{sw_bucket.bucket}",
        seaweed.endpoint,
        extra=["--app", "notes_app.py"],
    )
    node.start()
    try:
        node.ready()
        base = node.public_url + "/cells"
        counted = httpx.post(f"{base}/Counter/c/increment", json={"name": "x"})
        assert counted.json() == {"result": 1}
        assert httpx.post(f"{base}/Greeter/g/hello", json={"name": "x"}).json() == {
            "result": "hello x"
        }
        assert httpx.post(f"{base}/Note/n/read", json={}).json() == {"result": "note"}
        node.signal(signal.SIGTERM)
        assert node.wait(30) == 0
    finally:
        node.kill()
