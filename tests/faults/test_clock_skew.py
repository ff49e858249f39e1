"""A node whose clock disagrees with the store's (seen in the ``Date`` of the store's
answers, rewritten by the proxy) beyond ``--max-clock-skew`` (default TTL/4) refuses to
start, or fences itself when the skew appears later. ``Date`` has a resolution of one
second, so only an offset certainly beyond the bound counts. Lease TTL 3 s: bound 0.75 s."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.faults.conftest import MakeFaultFleet
from tests.faults.harness import FaultNode, is_log_line, keeps_serving, warm
from tests.faults.ledger import Ledger
from tests.helpers.fleet import wait_for

pytestmark = pytest.mark.faults

TTL = 3.0


def exited_or_ready(node: FaultNode, timeout: float) -> int | None:
    """The exit status if the process exits first, None once it serves."""

    def settled() -> tuple[int | None] | None:
        code = node.exit_code
        if code is not None:
            return (code,)
        if httpx.get(node.public_url + "/healthz", timeout=1).status_code == 200:
            return (None,)
        return None

    return wait_for(f"{node.node_id} to exit or serve", settled, timeout)[0]


def test_store_clock_5s_ahead_is_refused_at_start(make_fault_fleet: MakeFaultFleet) -> None:
    fleet = make_fault_fleet(size=1, lease_ttl=TTL, tag="skew5", start=False)
    node = fleet[0]
    node.proxy.clock_offset(5.0)
    node.start()
    assert exited_or_ready(node, 40) == 2, node.tail()
    lines = node.lines()
    errors = [line for line in lines if line.startswith("error:") and "clock" in line.lower()]
    assert errors, f"no 'error:' line about the clock offset:\n{node.tail()}"
    both = [
        line
        for line in lines
        if is_log_line(line)
        and "clock" in line.lower()
        and "store" in line.lower()
        and "local" in line.lower()
    ]
    assert both, f"no log line naming the store's and the local clock:\n{node.tail()}"


def test_store_clock_200ms_ahead_is_within_the_bound(make_fault_fleet: MakeFaultFleet) -> None:
    fleet = make_fault_fleet(size=1, lease_ttl=TTL, tag="skew02", start=False)
    node = fleet[0]
    node.proxy.clock_offset(0.2)
    node.start().ready(40)
    (ledger,) = warm(fleet, node, "skew02")
    keeps_serving(node, ledger, 2 * TTL)
    fleet.check([ledger])


def test_store_clock_jumping_5s_ahead_after_start_fences(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    fleet = make_fault_fleet(size=1, lease_ttl=TTL, tag="skewlate")
    node = fleet[0]
    (ledger,) = warm(fleet, node, "skewlate")
    skewed = time.time()
    node.proxy.clock_offset(5.0)
    wait_for("the node to exit", lambda: node.exit_code is not None, 2 * TTL + 1.0)
    assert node.exit_code == 3, node.tail()
    fenced_at = node.fence_time()
    assert fenced_at is not None and fenced_at - skewed <= 2 * TTL, node.tail()
    assert [line for line in node.fence_lines() if "clock" in line.lower()], node.tail()
    assert not ledger.acked_after(fenced_at)
    fleet.check([ledger], read_urls=[])


def test_max_clock_skew_flag_raises_the_bound(make_fault_fleet: MakeFaultFleet) -> None:
    """``--max-clock-skew 10`` accepts a store 5 s ahead: the node starts and serves."""
    fleet = make_fault_fleet(
        size=1, lease_ttl=TTL, tag="skewflag", extra=["--max-clock-skew", "10"], start=False
    )
    node = fleet[0]
    node.proxy.clock_offset(5.0)
    node.start()
    assert exited_or_ready(node, 40) is None, node.tail()
    ledger = Ledger("skewflag")
    keeps_serving(node, ledger, TTL)
    fleet.check([ledger])
