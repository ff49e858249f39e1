"""What ``cellactors serve`` says when it starts, as a real process on the embedded store:
its listeners as URLs, the fleet page and /metrics, a curl that works as printed, how to
reach the embedded store with boto3 (which works as printed), readable times, and each of
uvicorn's lines once."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cellactors.cli.welcome import example_call, next_steps
from tests.helpers.fleet import COUNTER_APP, NodeProc, wait_for

PREFIX = re.compile(r"^\S+ \S+ (?:INFO|WARNING|ERROR) [\w.]+: ")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProc]:
    started = NodeProc("hello", COUNTER_APP, tmp_path)
    started.extra = ["--data-dir", str(tmp_path / "cellactors-data")]
    yield started
    started.kill()


def _messages(output: str) -> list[str]:
    """The log lines' messages, without the time, level and logger."""
    return [PREFIX.sub("", line) for line in output.splitlines() if PREFIX.match(line)]


def test_serve_says_where_to_go_next(node: NodeProc) -> None:
    node.start().ready(60)
    public, internal = node.public_url, node.internal_url

    def announced() -> list[str] | None:
        lines = _messages(node.output())
        return lines if any(m.startswith("  aws s3 ls") for m in lines) else None

    messages = wait_for("the lines saying where to go next", announced, timeout=30)
    assert f"node hello serving: public {public}, internal {internal}" in messages
    assert any(m.startswith(f"public listener:   {public}") for m in messages)
    assert any(f"fleet page: {internal}/" in m and f"{internal}/metrics" in m for m in messages)
    assert httpx.get(internal + "/metrics").status_code == 200
    # The curl works as printed.
    curl = next(m for m in messages if m.startswith("try: curl "))
    words = shlex.split(curl[len("try: ") :])
    assert words[words.index("-X") + 1] == "POST"
    url, body = words[words.index("-X") + 2], words[words.index("-d") + 1]
    answer = httpx.post(url, content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 200 and "result" in answer.json(), answer.text
    # So do the exports, with nothing of AWS_* from this environment.
    exports = [m.strip() for m in messages if m.strip().startswith("export AWS_")]
    assert len(exports) == 3
    secret_line = next(e for e in exports if "SECRET" in e)
    assert "$(python3" in secret_line  # the secret stays in its file, never in the log
    listing = (
        "import boto3; "
        "print(boto3.client('s3').list_objects_v2(Bucket='cellactors')['KeyCount'] > 0)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    script = "; ".join([*exports, f"{shlex.quote(sys.executable)} -c {shlex.quote(listing)}"])
    done = subprocess.run(
        ["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr
    node.signal(signal.SIGTERM)
    assert node.wait(30) == 0
    out = node.output()
    # Readable times: ISO-like local time in every line and in the lease's expiry.
    assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d INFO ", out)
    lease = next(m for m in _messages(out) if "holds its lease until" in m)
    assert re.search(r"until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d$", lease)
    # Each of uvicorn's lines once (two servers share its logger).
    uvicorn = [
        line.split(" uvicorn.error: ", 1)[1]
        for line in out.splitlines()
        if " uvicorn.error: " in line
    ]
    assert "Application startup complete." in uvicorn
    assert len(uvicorn) == len(set(uvicorn)), uvicorn


def test_the_example_call_fills_in_the_required_arguments() -> None:
    from tests.helpers.cells import Counter

    line = example_call("http://127.0.0.1:1", [Counter])
    body = json.loads(shlex.split(line)[-1])
    assert line.startswith("curl -X POST http://127.0.0.1:1/cells/Counter/example/")
    assert isinstance(body, dict)
    lines = next_steps(("::1", 8080), ("127.0.0.1", 8081), [Counter])
    assert lines[0].startswith("public listener:   http://[::1]:8080")
    assert not any("export" in line for line in lines)  # no embedded store, no exports
