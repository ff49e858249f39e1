"""An exception in a cell's code is logged once at ERROR with its traceback on the node that
ran it (logger ``cellactors.cells``); its traceback reaches a caller only from a node in
debug mode (``cellactors.testing``, ``serve --debug``), never by default over HTTP."""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

import httpx
import pytest

from cellactors import CellActor, Client
from cellactors.errors import ActivationRaised, MethodFailed
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server.app import ServerSettings
from cellactors.testing import Fleet
from tests.helpers.fleet import NodeProc
from tests.helpers.runtime import eventually
from tests.helpers.served import served_node


class Faulty(CellActor):
    """Raises from a method, and from ``on_alarm`` (each retry logs its own failure)."""

    def explode(self) -> int:
        raise KeyError("explode-line")  # the raising line the log must show

    def arm(self) -> None:
        self.set_alarm(0)

    def on_alarm(self) -> None:
        raise RuntimeError("alarm-line")


class NoStart(CellActor):
    """Its ``on_activate`` raises."""

    def on_activate(self) -> None:
        raise ValueError("activate-line")

    def get(self) -> int:
        return 1


def _trace(record: logging.LogRecord) -> str:
    return "".join(traceback.format_exception(*record.exc_info)) if record.exc_info else ""


def _logged(caplog: pytest.LogCaptureFixture, line: str, runs: int = 1) -> str:
    """The traceback of the records (of any logger) that show ``line``: one ERROR of
    ``cellactors.cells`` per run of the code (not logged again by another layer)."""
    found = [r for r in caplog.records if line in _trace(r)]
    assert [(r.name, r.levelno) for r in found] == [("cellactors.cells", logging.ERROR)] * runs
    return _trace(found[0])


def test_a_method_raising_is_logged_with_its_traceback_and_its_cause_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="cellactors.cells")
    with Fleet([Faulty], nodes=1) as fleet, pytest.raises(MethodFailed) as info:
        fleet.cell(Faulty, "a").explode()
    assert isinstance(info.value.__cause__, KeyError)
    assert info.value.remote_traceback is not None
    assert "in explode" in info.value.remote_traceback
    text = _logged(caplog, 'raise KeyError("explode-line")')
    assert "test_tracebacks.py" in text and "in explode" in text


def test_on_activate_raising_is_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="cellactors.cells")
    with Fleet([NoStart], nodes=1) as fleet, pytest.raises(ActivationRaised):
        fleet.cell(NoStart, "a").get()
    text = _logged(caplog, 'raise ValueError("activate-line")')
    assert "test_tracebacks.py" in text and "in on_activate" in text


def test_on_alarm_raising_is_logged_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="cellactors.cells")
    with Fleet([Faulty], nodes=1) as fleet:
        fleet.cell(Faulty, "a").arm()
        eventually(
            lambda: any('raise RuntimeError("alarm-line")' in _trace(r) for r in caplog.records)
        )
    runs = sum('raise RuntimeError("alarm-line")' in _trace(r) for r in caplog.records)
    text = _logged(caplog, 'raise RuntimeError("alarm-line")', runs)
    assert "test_tracebacks.py" in text and "in on_alarm" in text


def test_remote_callers_get_no_traceback_by_default(sw_bucket: S3Bucket) -> None:
    with served_node(sw_bucket, "n1", classes=(Faulty,)) as served:
        answer = httpx.post(f"{served.public}/cells/Faulty/a/explode", json={}, timeout=30)
        assert answer.status_code == 422
        body = answer.json()
        assert body["type"] == "KeyError" and "explode-line" in body["detail"]
        assert "traceback" not in body
        with Client(served.public) as client, pytest.raises(MethodFailed) as info:
            client.call("Faulty", "a", "explode")
        assert info.value.remote_traceback is None


def test_a_debug_node_sends_the_traceback_to_the_client(sw_bucket: S3Bucket) -> None:
    settings = ServerSettings(debug=True)
    served_faulty = served_node(sw_bucket, "n1", settings=settings, classes=(Faulty,))
    with served_faulty as served, Client(served.public) as client:
        info = pytest.raises(MethodFailed)
        with info as raised:
            client.call("Faulty", "a", "explode")
    info_value = raised.value
    assert info_value.exc_type == "KeyError" and "explode-line" in info_value.exc_message
    assert info_value.remote_traceback is not None
    assert "in explode" in info_value.remote_traceback


FAULTY_APP = """
from cellactors import CellActor


class Faulty(CellActor):
    def explode(self) -> int:
        raise KeyError("explode-line")
"""


@pytest.mark.parametrize("debug", [False, True])
def test_serve_debug_sends_the_traceback_only_when_asked(
    tmp_path: Path, sw_bucket: S3Bucket, seaweed: SeaweedServer, debug: bool
) -> None:
    """``cellactors serve --debug`` (a real process) puts the traceback in the error body;
    without it the body has none."""
    app = tmp_path / "faulty_app.py"
    app.write_text(FAULTY_APP)
    extra = ["--debug"] if debug else []
    spec = f"s3://{sw_bucket.bucket}"
    node = NodeProc("dbg", app, tmp_path, spec, seaweed.endpoint, extra=extra)
    node.start()
    try:
        node.ready()
        answer = httpx.post(f"{node.public_url}/cells/Faulty/a/explode", json={}, timeout=30)
        assert answer.status_code == 422
        trace = answer.json().get("traceback")
        assert (trace is not None and "in explode" in trace) if debug else trace is None
    finally:
        node.kill()
