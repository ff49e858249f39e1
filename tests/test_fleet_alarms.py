"""Alarms, calls between cells and the outbox on real ``cellactors serve`` processes over a
real SeaweedFS: a released cell's alarm fires within the scan interval, a SIGKILLed owner's
alarm fires once on another node, a failing alarm backs off and is abandoned, a cycle of
calls across nodes fails fast with ``call_cycle``. Every wait polls with a deadline."""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cellactors.clock import SLEW
from cellactors.persistence.control.wakes import parse_wake_key
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.fleet import NODE_HEADER, Fleet, NodeProc, wait_for
from tests.helpers.stores import make_s3_bucket

pytestmark = pytest.mark.fleet

APP = Path(__file__).resolve().parent / "helpers" / "alarm_cells.py"
SCAN = 0.5


@pytest.fixture
def fleet(tmp_path: Path, seaweed: SeaweedServer) -> Iterator[tuple[Fleet, S3Bucket]]:
    bucket = make_s3_bucket(seaweed.endpoint)
    extra = ["--alarm-scan-interval", str(SCAN), "--idle-timeout", "1", "--hibernate-after", "5"]
    nodes = [
        NodeProc(
            f"a{i}",
            APP,
            tmp_path / f"n{i}",
            f"s3://{bucket.bucket}",
            seaweed.endpoint,
            lease_ttl=2.0,
            extra=extra,
        )
        for i in range(3)
    ]
    fl = Fleet(nodes).start()
    try:
        yield fl, bucket
    finally:
        fl.stop()


def call(url: str, cls: str, name: str, method: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{url}/cells/{cls}/{name}/{method}", json=kwargs, timeout=30)


def result(url: str, cls: str, name: str, method: str, **kwargs: Any) -> Any:
    resp = call(url, cls, name, method, **kwargs)
    assert resp.status_code == 200, resp.text
    return resp.json()["result"]


def metric(node: NodeProc, name: str, **labels: str) -> float:
    text = httpx.get(node.internal_url + "/metrics", timeout=5).text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m and ",".join(sorted(m.group(1).split(","))) == want:
            return float(m.group(2))
    return 0.0


def live_urls(fl: Fleet) -> list[str]:
    return [n.public_url for n in fl if n.running]


def read_fired(fl: Fleet, cell: str) -> list[float]:
    def read() -> list[float] | None:
        for url in live_urls(fl):
            resp = call(url, "Reminder", cell, "fired")
            if resp.status_code == 200:
                return list(resp.json()["result"]) or None
        return None

    return wait_for(f"Reminder:{cell} fired", read, 30)


def test_a_released_cells_alarm_fires_within_the_scan_interval(
    fleet: tuple[Fleet, S3Bucket],
) -> None:
    fl, bucket = fleet
    at = result(fl[0].public_url, "Reminder", "p", "remind", delay=3.0)
    # Idle for 1 s: released (passivated) by its node, hosted nowhere until the alarm.
    wait_for("release", lambda: "Reminder:p" not in fl[0].hosted(), 15)
    fired = read_fired(fl, "p")
    assert len(fired) == 1 and at <= fired[0] < at + SCAN + 1.5
    wait_for("wake entry deleted", lambda: not list(bucket.list("wake/")), 10)


def test_a_sigkilled_owners_alarm_fires_once_on_another_node(
    fleet: tuple[Fleet, S3Bucket],
) -> None:
    fl, bucket = fleet
    resp = call(fl[1].public_url, "Reminder", "k", "remind", delay=1.0, every=0.4)
    assert resp.status_code == 200 and resp.headers[NODE_HEADER] == "a1"
    keys = [parse_wake_key(o.key) for o in bucket.list("wake/")]
    assert [k[0] for k in keys if k] == ["Reminder:k"]  # written before the answer
    killed_at = time.time()
    fl[1].kill()

    # The next run happens after the lease expired (2 s), on a surviving node.
    def after_takeover() -> list[float] | None:
        fired = read_fired(fl, "k")
        return fired if len(fired) >= 3 and fired[-1] > killed_at + 1.5 else None

    fired = wait_for("runs after takeover", after_takeover, 30)
    gaps = [b - a for a, b in itertools.pairwise(fired)]
    assert min(gaps) >= 0.39  # one run at a time: never twice from two nodes
    owners = {n.node_id for n, _ in fl.owners("Reminder:k")}
    assert owners <= {"a0", "a2"} and len(owners) == 1
    survivor = next(n for n in fl if n.node_id in owners)
    labels = {"class": "Reminder", "result": "fired"}
    wait_for(
        "the run counted",
        lambda: metric(survivor, "cellactors_alarm_runs_total", **labels) >= 1,
        10,
    )


def test_a_failing_alarm_backs_off_and_is_abandoned(fleet: tuple[Fleet, S3Bucket]) -> None:
    fl, bucket = fleet
    node = fl[2]
    started = time.time()
    result(node.public_url, "Flaky", "f", "arm", delay=0.1)
    labels = {"class": "Flaky"}
    wait_for(
        "abandoned",
        lambda: metric(node, "cellactors_alarm_runs_total", result="abandoned", **labels) == 1,
        20,
    )
    # Two backoffs (0.2 s, then the 0.4 s cap), on the runtime's clock, which absorbs the
    # corrections of its store-time estimate at most SLEW faster than real time.
    assert time.time() - started >= (0.1 + 0.2 + 0.4) / (1 + SLEW)
    assert metric(node, "cellactors_alarm_runs_total", result="retry", **labels) == 2
    assert "abandoned after its last allowed failure" in node.output()
    assert result(node.public_url, "Flaky", "f", "alarm") is None
    wait_for("wake entry deleted", lambda: not list(bucket.list("wake/")), 10)


def test_calls_between_cells_cross_nodes_and_a_cycle_fails_fast(
    fleet: tuple[Fleet, S3Bucket],
) -> None:
    fl, _ = fleet
    for node, name in zip(fl, ("x", "y", "z"), strict=True):  # one cell per node
        assert call(node.public_url, "Hop", name, "seen").headers[NODE_HEADER] == node.node_id
    assert result(fl[0].public_url, "Hop", "x", "relay", path=["y", "z"], value="v") == [
        "x",
        "y",
        "z",
    ]
    assert result(fl[2].public_url, "Hop", "z", "seen") == ["v"]
    started = time.monotonic()
    assert result(fl[0].public_url, "Hop", "x", "probe_cycle", path=["y", "z", "x"]) == (
        "call_cycle/failed"  # z's call to x was refused; z and y let it escape, as a 409
    )
    assert result(fl[1].public_url, "Hop", "y", "probe_cycle", path=["y"]) == "call_cycle/not_run"
    assert time.monotonic() - started < 5  # refused, not a deadlock until a timeout
    # The outbox across nodes: messages from x (a0) to Inbox:i, delivered once, in order.
    result(fl[1].public_url, "Inbox", "i", "got")
    result(fl[0].public_url, "Hop", "x", "post", to="i", values=["1", "2", "3"])
    wait_for("delivery", lambda: len(result(fl[1].public_url, "Inbox", "i", "got")) == 3, 15)
    assert result(fl[1].public_url, "Inbox", "i", "got") == [["x", "1"], ["x", "2"], ["x", "3"]]
