"""Typed client handles are checked by mypy: ``tests/typing/client_usage.py`` type-checks
clean, and a call with an argument of the wrong type (or an unknown method) through a handle
typed by its class is reported; positional arguments are named by the class's signature."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cellactors.attempts import keyword_arguments
from cellactors.client import CellHandle, Client
from tests.helpers.cells import Counter

ROOT = Path(__file__).resolve().parent.parent

BAD = """
from cellactors.async_client import AsyncClient
from cellactors.client import Client
from tests.helpers.cells import Counter


def wrong(client: Client) -> None:
    client.cell(Counter, "a").increment(name=3)
    client.cell(Counter, "a").no_such_method()


async def wrong_async(client: AsyncClient) -> str:
    return await client.cell(Counter, "a").run(Counter.increment, name=3)
"""


def test_mypy_accepts_typed_usage_and_reports_a_wrong_argument_type(tmp_path: Path) -> None:
    bad = tmp_path / "wrong_usage.py"
    bad.write_text(BAD)
    usage = ROOT / "tests" / "typing" / "client_usage.py"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--no-error-summary",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(usage),
            str(bad),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "No module named" not in run.stderr, run.stderr  # mypy is in the test extra
    lines = [line for line in run.stdout.splitlines() if ": error:" in line]
    assert not [line for line in lines if "client_usage.py" in line], run.stdout
    assert any(
        "wrong_usage.py:8:" in line and 'Argument "name"' in line and '"int"' in line
        for line in lines
    ), run.stdout
    assert any("wrong_usage.py:9:" in line and "no_such_method" in line for line in lines)
    assert any("wrong_usage.py:13:" in line and '"name"' in line for line in lines), run.stdout
    # The result type is checked too: ``increment`` returns an int, not the str awaited.
    assert any("wrong_usage.py:13:" in line and 'int], str]"' in line for line in lines)


def test_typed_handle_names_positional_arguments_and_untyped_refuses_them() -> None:
    assert keyword_arguments(Counter, "increment", ("x",), {"by": 2}) == {"name": "x", "by": 2}
    assert keyword_arguments(None, "increment", (), {"name": "x"}) == {"name": "x"}
    client = Client("http://127.0.0.1:9")
    typed = client.cell(Counter, "a")
    assert isinstance(typed, CellHandle)
    untyped = client.cell("Counter", "a")
    try:
        untyped.increment("x")
    except TypeError as e:
        assert "keyword arguments only" in str(e)
    else:
        raise AssertionError("an untyped handle took a positional argument")
