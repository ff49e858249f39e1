"""The holder's rule for pushes (:func:`cellactors.core.sockets.on_push`) and the small
rules beside it, driven without a node, a thread or a store."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellactors.core import sockets
from cellactors.core.sockets import Action, Push, Stream


def test_a_push_in_order_is_delivered() -> None:
    assert sockets.on_push(Stream(3, 10), 3, 10, 11) is Action.DELIVER
    # Pushes between prev and seq went to other holders: nothing is missing here.
    assert sockets.on_push(Stream(3, 10), 3, 7, 12) is Action.DELIVER


def test_a_push_already_had_is_ignored() -> None:
    assert sockets.on_push(Stream(3, 10), 3, 8, 9) is Action.IGNORE
    assert sockets.on_push(Stream(3, 10), 3, 9, 10) is Action.IGNORE


@pytest.mark.parametrize(
    ("stream", "epoch", "prev"),
    [
        (None, 3, 10),  # nothing received yet
        (Stream(3, 10), 4, 10),  # a new owner
        (Stream(3, 10), 3, None),  # the owner does not know what it sent last
        (Stream(3, 10), 3, 11),  # push 11 never arrived
    ],
)
def test_anything_that_may_hide_a_gap_syncs(
    stream: Stream | None, epoch: int, prev: int | None
) -> None:
    assert sockets.on_push(stream, epoch, prev, 12) is Action.SYNC


@given(st.lists(st.booleans(), min_size=1, max_size=40))
def test_a_holder_passes_on_every_push_once_and_in_order(lost: list[bool]) -> None:
    """Whatever deliveries go missing, delivering what the rule allows and syncing (all
    pushes after the stream) when it says so gives each push exactly once, in order."""
    pushes = list(range(1, len(lost) + 1))
    stream = Stream(1, 0)
    passed: list[int] = []
    prev: int | None = None
    for seq, drop in zip(pushes, lost, strict=True):
        if not drop:
            action = sockets.on_push(stream, 1, prev, seq)
            if action is Action.DELIVER:
                passed.append(seq)
                stream.last = seq
            elif action is Action.SYNC:
                passed += [s for s in pushes if stream.last < s <= seq]
                stream.last = seq
        prev = seq
    passed += [s for s in pushes if s > stream.last]  # the watch's last sync
    assert passed == pushes


def test_for_conn_and_missed() -> None:
    pushes = [
        Push(1, ("a",), sockets.TEXT, "x"),
        Push(2, ("b",), sockets.TEXT, "y"),
        Push(3, ("a", "b"), sockets.TEXT, "z"),
    ]
    assert [p.seq for p in sockets.for_conn(pushes, "a", 1)] == [3]
    assert not sockets.missed(0, 0)  # nothing was ever dropped
    assert not sockets.missed(5, 4)  # everything after 4 is kept
    assert sockets.missed(5, 3)  # push 4 may have been for it
    assert sockets.retained_from(1000) == 1000 - sockets.RETAINED_PUSHES + 1
    assert sockets.retained_from(3) == 1


def test_tags_and_ids() -> None:
    assert sockets.check_tags(["a", "b", "a"]) == ("a", "b")
    for bad in ("a", ["x" * 65], [""], [1], ["t"] * 17):
        with pytest.raises(ValueError):
            sockets.check_tags(bad if bad != ["t"] * 17 else [f"t{i}" for i in range(17)])
    conn = sockets.new_conn_id()
    assert sockets.valid_conn_id(conn) and len(conn) == 22
    assert not sockets.valid_conn_id(conn + "x") and not sockets.valid_conn_id("../" + conn[3:])


def test_a_close_reason_fits_a_close_frame_in_whole_characters() -> None:
    """A close frame carries at most 123 bytes of reason: a longer one (an exception's
    message, a cell's own reason in another script) is cut, never mid-character."""
    assert sockets.close_reason("short") == "short"
    cut = sockets.close_reason("é" * 100)  # 200 bytes
    assert len(cut.encode()) <= 123 and cut == "é" * 61
