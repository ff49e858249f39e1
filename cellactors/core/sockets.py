"""Sockets into cells: the rules, pure.

A socket is held by the node its client connected to (the *holder*); the cell runs on its
owner. Messages a transaction sends to sockets (*pushes*) are rows of that transaction,
numbered by one sequence per cell, and leave the owner only once the transaction is
durable. The owner sends each holder the pushes for its sockets in order, each naming the
previous one it sent that holder (``prev``); the holder keeps, per cell, the last push it
received in order (its :class:`Stream`), and, per socket, the last push it passed on (the
socket's cursor). :func:`on_push` decides what a holder does with a push: pass it on,
ignore it (it had it), or ask the owner for everything after its cursors (a *sync*: the
owner is new, or a push went missing). A sync answers with the retained pushes, so nothing
acknowledged is lost across a takeover, and the cursors keep anything from arriving twice.
"""

from __future__ import annotations

import enum
import re
import secrets
from dataclasses import dataclass

#: The subprotocol a client asks for to get numbered frames (and to resume after a drop).
SUBPROTOCOL = "cellactors.v1"

#: Push kinds: a text frame, a binary frame, or a close of the socket by the cell.
TEXT, BYTES, CLOSE = "text", "bytes", "close"

#: The most one push may weigh (a frame to a socket), and the most pushes one delivery to
#: a holder carries: a transaction that sends more reaches a holder in several.
MAX_PUSH_BYTES = 1 << 20
DELIVERY_BYTES = 4 << 20

#: How many pushes a cell keeps after sending them: a holder that lost fewer (a takeover,
#: a reconnect) gets them again; one that lost more is told so (``CLOSE_MISSED``).
RETAINED_PUSHES = 256

# Close codes (RFC 6455 for the standard ones, 4000-4999 are the application's).
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001  # the node holding the socket is stopping: reconnect elsewhere
CLOSE_NOT_UTF8 = 1007  # a text frame that is not UTF-8 (the protocol closes it)
CLOSE_NO_STATUS = 1005  # (never sent) a close without a code, or a connection that ended
CLOSE_HOLDER_LOST = 1006  # (never sent) what ``on_close`` gets when a holder vanished
CLOSE_TOO_BIG = 1009  # a frame over the node's limit
CLOSE_FAILED = 1011  # the cell's handler raised, or the cell could not be reached
CLOSE_SERVICE_RESTART = 1012  # the node's listener is stopping (uvicorn closes with it)
CLOSE_TRY_LATER = 1013  # the node is at its socket limit, or not serving
CLOSE_REFUSED = 4403  # on_connect refused the socket
CLOSE_GONE = 4404  # resumed a socket the cell no longer has
CLOSE_SLOW = 4408  # the client read too slowly: its unsent buffer passed the limit
CLOSE_MISSED = 4410  # resumed after more pushes than the cell retains

#: A socket id: 22 URL-safe characters (128 random bits).
_CONN_ID = re.compile(r"^[A-Za-z0-9_-]{22}$")


def new_conn_id() -> str:
    """A fresh, unguessable socket id (it names the socket to resume)."""
    return secrets.token_urlsafe(16)


def valid_conn_id(value: str) -> bool:
    """Whether ``value`` has the shape of a socket id (anything else is refused)."""
    return bool(_CONN_ID.match(value))


@dataclass(frozen=True)
class Holder:
    """The node holding a socket: its id, internal address and process generation (a
    push is signed for that process; a restarted holder has lost its sockets)."""

    node: str
    addr: str
    generation: str

    def to_wire(self) -> list[str]:
        return [self.node, self.addr, self.generation]

    @classmethod
    def from_wire(cls, value: object) -> Holder:
        if not (isinstance(value, list | tuple) and len(value) == 3):
            raise ValueError(f"not a holder: {value!r}")
        node, addr, generation = (str(v) for v in value)
        return cls(node, addr, generation)


@dataclass(frozen=True)
class Push:
    """One message a transaction sent: its number, the sockets it goes to, and what."""

    seq: int
    conns: tuple[str, ...]
    kind: str
    data: str | bytes
    #: For ``CLOSE``: the close code (the reason is ``data``).
    code: int = CLOSE_NORMAL


@dataclass(frozen=True)
class Delivery:
    """Pushes of one cell for one holder, in order: ``prev`` is the push the owner sent that
    holder before the first of them (None: the owner does not know, it is new)."""

    cell_id: str
    epoch: int
    prev: int | None
    pushes: tuple[Push, ...]


@dataclass
class Stream:
    """What a holder received in order from one cell's owner: its epoch, the last push,
    and the owner (watched: a holder whose owner vanished syncs, to get what it missed)."""

    epoch: int
    last: int
    owner: Holder | None = None


class Action(enum.Enum):
    DELIVER = "deliver"  # pass it on to the sockets whose cursor is behind it
    IGNORE = "ignore"  # had it already
    SYNC = "sync"  # something before it may be missing: ask the owner


def on_push(stream: Stream | None, epoch: int, prev: int | None, seq: int) -> Action:
    """What a holder does with push ``seq`` that the owner at ``epoch`` sent after ``prev``."""
    if stream is not None and stream.epoch == epoch and seq <= stream.last:
        return Action.IGNORE
    if stream is None or stream.epoch != epoch or prev is None or prev > stream.last:
        return Action.SYNC
    return Action.DELIVER


def for_conn(pushes: list[Push] | tuple[Push, ...], conn: str, cursor: int) -> list[Push]:
    """The pushes after ``cursor`` that go to socket ``conn``, in order."""
    return [p for p in pushes if p.seq > cursor and conn in p.conns]


def missed(floor: int, cursor: int) -> bool:
    """Whether a socket whose cursor is ``cursor`` may have missed pushes the cell no longer
    keeps (``floor``: the oldest retained push; 0: none was ever dropped)."""
    return floor > 0 and cursor < floor - 1


def retained_from(head: int, keep: int = RETAINED_PUSHES) -> int:
    """The oldest push to keep once push ``head`` is written."""
    return max(1, head - keep + 1)


#: A close frame's reason holds at most 123 bytes of UTF-8 (RFC 6455, 5.5).
MAX_CLOSE_REASON_BYTES = 123


def close_reason(text: str) -> str:
    """``text`` cut to what a close frame can carry (whole characters): longer, the close
    itself would fail and the socket would be dropped without its code."""
    data = text.encode("utf-8")[:MAX_CLOSE_REASON_BYTES]
    return data.decode("utf-8", errors="ignore")


def check_tags(tags: object, limit: int = 16) -> tuple[str, ...]:
    """Socket tags: up to ``limit`` non-empty strings of at most 64 characters."""
    if isinstance(tags, str) or not isinstance(tags, list | tuple | set | frozenset):
        raise ValueError("tags are a list of strings")
    out = tuple(dict.fromkeys(tags))
    if len(out) > limit:
        raise ValueError(f"at most {limit} tags per socket")
    for tag in out:
        if not isinstance(tag, str) or not 0 < len(tag) <= 64:
            raise ValueError(f"a tag is a string of 1 to 64 characters, not {tag!r}")
    return out
