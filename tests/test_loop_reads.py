"""Read-only methods never hold up the serving event loop for long: one runs on the loop
only once its last runs each took less than the budget (10 ms), its SQL is interrupted past
it there (the call then runs again in a worker thread, and answers right), and a run that
overstays for any reason sends the method off the loop again. Health checks and other
cells' calls answer meanwhile. Before, a 3 s read stalled ``/healthz`` for 2.7 s."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from cellactors import CellActor, read_only
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.cells import Counter
from tests.helpers.served import served_node

SLOW_SQL = (
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
    "SELECT count(*) FROM n"
)


class Reports(CellActor):
    def on_activate(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS r (n INTEGER)")

    def touch(self) -> None:
        """A write: it creates the cell (reads of a cell nobody created create nothing)."""
        self.db.execute("INSERT INTO r (n) VALUES (1)")

    @read_only
    def count_to(self, n: int) -> int:
        return int(self.db.execute(SLOW_SQL, [n]).fetchone()[0])

    @read_only
    def nap(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


def call(url: str, method: str, timeout: float = 60, **kwargs: Any) -> Any:
    resp = httpx.post(f"{url}/cells/Reports/r/{method}", json=kwargs, timeout=timeout)
    assert resp.status_code == 200, resp.text
    return resp.json()["result"]


def slowest_health_check(url: str, busy: Callable[[], Any]) -> tuple[float, Any]:
    """Run ``busy`` in a thread and poll ``/healthz`` until it is done: the longest a
    health check took meanwhile, and what ``busy`` returned."""
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(busy()), daemon=True)
    worker.start()
    slowest = 0.0
    with httpx.Client(timeout=10) as http:
        while worker.is_alive():
            started = time.perf_counter()
            assert http.get(f"{url}/healthz").status_code == 200
            slowest = max(slowest, time.perf_counter() - started)
    worker.join()
    return slowest, out[0]


@pytest.fixture
def served(sw_bucket: S3Bucket) -> Any:
    with served_node(sw_bucket, "n1", classes=(Reports, Counter)) as node:
        assert call(node.public, "touch") is None  # the cell exists and is active
        yield node


def test_a_slow_read_never_proven_quick_runs_off_the_loop(served: Any) -> None:
    slowest, result = slowest_health_check(
        served.public, lambda: call(served.public, "nap", seconds=1.5)
    )
    assert result == 1.5
    assert slowest < 0.5, f"a health check waited {slowest:.2f}s behind a read"


def prove_quick(served: Any, method: str, answer: Any, **kwargs: Any) -> None:
    """Call ``method`` until its reads prove quick (at least the four the rule needs; more
    when a loaded machine slowed one past the budget), for at most 30 s."""
    deadline = time.monotonic() + 30
    for _ in range(4):
        assert call(served.public, method, **kwargs) == answer
    while not served.node.quick_reads.quick(("Reports", method)) and time.monotonic() < deadline:
        assert call(served.public, method, **kwargs) == answer


def test_sql_past_the_budget_on_the_loop_is_interrupted_and_answered_off_it(served: Any) -> None:
    # Proven quick (on the loop now): a run slowed by a loaded machine just takes more.
    prove_quick(served, "count_to", 10, n=10)
    assert served.node.quick_reads.quick(("Reports", "count_to"))
    slowest, result = slowest_health_check(
        served.public, lambda: call(served.public, "count_to", n=3_000_000)
    )
    assert result == 3_000_000  # the interrupted run did not answer; the rerun did
    assert slowest < 0.5, f"a health check waited {slowest:.2f}s behind a read"
    assert not served.node.quick_reads.quick(("Reports", "count_to"))


def test_python_that_overstays_once_sends_the_method_off_the_loop(served: Any) -> None:
    """Python code (a sleep) cannot be interrupted: a proven method that overstays holds the
    loop that once, then runs off it until it proves quick again."""
    prove_quick(served, "nap", 0, seconds=0)
    assert served.node.quick_reads.quick(("Reports", "nap"))
    assert call(served.public, "nap", seconds=0.2) == 0.2
    assert not served.node.quick_reads.quick(("Reports", "nap"))
    slowest, result = slowest_health_check(
        served.public, lambda: call(served.public, "nap", seconds=1.5)
    )
    assert result == 1.5 and slowest < 0.5
