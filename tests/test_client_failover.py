"""The Python client riding out a node's crash, against real ``cellactors serve`` processes:
two nodes on one SeaweedFS bucket with a short lease TTL, the owner of a cell SIGKILLed, and
a call made at once through a Client given both URLs. It must succeed once the surviving
node has taken the cell over (after the TTL), and be applied exactly once.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cellactors.client import Client
from cellactors.persistence.store.embedded import SeaweedServer
from tests.helpers.fleet import Fleet, NodeProc, write_app
from tests.helpers.stores import make_s3_bucket

pytestmark = pytest.mark.fleet

TTL = 2.5


@pytest.fixture
def pair(tmp_path: Path, seaweed: SeaweedServer) -> Iterator[Fleet]:
    """Two nodes on a fresh bucket; both processes are killed at teardown."""
    bucket = make_s3_bucket(seaweed.endpoint)
    app = write_app(tmp_path)
    spec = f"s3://{bucket.bucket}"
    fleet = Fleet(
        [
            NodeProc(f"c-{i}", app, tmp_path / f"n{i}", spec, seaweed.endpoint, lease_ttl=TTL)
            for i in range(2)
        ]
    )
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.stop()


@pytest.mark.parametrize("warm", [True, False], ids=["pooled", "fresh"])
def test_a_call_right_after_the_owner_is_killed_succeeds_and_runs_once(
    pair: Fleet, warm: bool
) -> None:
    """``warm``: the client has keep-alive connections to both nodes when the owner dies (a
    pooled connection to a dead node); otherwise its first request after the kill opens
    them. The surviving node answers ``node_unavailable`` until the owner's lease expires,
    then takes the cell over; the client keeps trying (its default deadline covers the TTL
    and the takeover) and the call's key makes the effect single."""
    sent: list[str] = []
    http = httpx.Client(
        timeout=httpx.Timeout(40.0, connect=3.0),
        event_hooks={"request": [lambda r: sent.append(str(r.url))]},
    )
    with Client(pair.urls, http=http) as client:
        tally = client.cell("Tally", "t")
        assert tally.add(entry="before") == 1
        if warm:
            assert [tally.rows() for _ in pair.urls] == [["before"]] * len(pair.urls)
        owner, _ = pair.owner("Tally:t")
        owner.signal(signal.SIGKILL)
        assert owner.wait(10) == -signal.SIGKILL
        sent.clear()
        killed = time.monotonic()
        assert tally.add(entry="after") == 2
        took = time.monotonic() - killed
        assert tally.rows() == ["before", "after"]  # applied exactly once
    survivor = next(n for n in pair if n is not owner)
    assert pair.owner("Tally:t")[0] is survivor
    assert len(sent) > 3  # it was refused and answered not_run before the takeover
    assert took < 30.0
