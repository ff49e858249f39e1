"""A chat room that fans out to its members: ``cellactors serve --app examples/chat.py``, then

    curl -X POST localhost:8080/cells/Room/lobby/join -d '{"member": "ann"}'
    curl -X POST localhost:8080/cells/Room/lobby/join -d '{"member": "bo"}'
    curl -X POST localhost:8080/cells/Room/lobby/say -d '{"member": "ann", "text": "hi"}'
    curl -X POST localhost:8080/cells/Member/bo/inbox -d '{}'

``say`` stores the line and, in the same transaction, one outbox message per other member:
each member's inbox gets every line exactly once and in the room's order, whichever nodes
host the room and the members, and the line is acknowledged without waiting for them. The
room also keeps itself tidy with an alarm: lines older than ``keep_seconds`` are deleted by
``on_alarm``, which sets the next alarm while lines remain.

``ChatRoom`` is the same idea over WebSockets, with a page: ``examples/chat.html``. Serve
the cells and the page (any static server; the nodes must allow the page's origin, as a
socket has no CORS preflight to stop a page from elsewhere):

    cellactors serve --app examples/chat.py --cors-origin http://127.0.0.1:8000
    cd examples && python -m http.server --bind 127.0.0.1 8000

then open ``http://127.0.0.1:8000/chat.html?nodes=ws://127.0.0.1:8080&room=lobby&name=ann``
in two windows (another name in the second). With a fleet, list every node in ``nodes``
(comma-separated, each node given the same ``--cors-origin``): the page connects to the first
and, when the node holding its socket goes away, resumes the socket on the next, missing
nothing and showing nothing twice. Each socket says who it is with a tag (``?tag=name:ann``,
which the page adds); on connect it gets the room's recent lines, and everyone gets a
``joined``; each text message (``{"id": ..., "text": ...}``) is stored and sent to every
socket; a socket that closes brings a ``left``. Every frame to the page is JSON with a
``type``: ``history``, ``line``, ``joined`` or ``left``. A page resends what it sent and has
not seen come back (after a resume, say); the message ``id`` keeps it from being stored
twice.
"""

from __future__ import annotations

import json
from typing import Any

from cellactors import CellActor, read_only
from cellactors.actors.sockets import Connection


class Room(CellActor):
    """Members and the recent lines of one room."""

    keep_seconds = 24 * 3600.0

    def on_activate(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS members (name TEXT PRIMARY KEY)")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS lines (seq INTEGER PRIMARY KEY, at REAL NOT NULL, "
            "member TEXT NOT NULL, text TEXT NOT NULL)"
        )

    def join(self, member: str) -> list[str]:
        self.db.execute("INSERT OR IGNORE INTO members (name) VALUES (?)", [member])
        return self.members()

    def leave(self, member: str) -> list[str]:
        self.db.execute("DELETE FROM members WHERE name = ?", [member])
        return self.members()

    @read_only
    def members(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT name FROM members ORDER BY name")]

    def say(self, member: str, text: str) -> int:
        """Post a line; every other member receives it through the outbox."""
        if member not in self.members():
            raise ValueError(f"{member} is not in room {self.name}")
        now = self.now()
        cur = self.db.execute(
            "INSERT INTO lines (at, member, text) VALUES (?, ?, ?)", [now, member, text]
        )
        seq = int(cur.lastrowid or 0)
        for other in self.members():
            if other != member:
                self.send(
                    Member, other, "deliver", room=self.name, seq=seq, sender=member, text=text
                )
        if self.get_alarm() is None:
            self.set_alarm(now + self.keep_seconds)
        return seq

    @read_only
    def history(self, limit: int = 50) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT seq, member, text FROM lines ORDER BY seq DESC LIMIT ?", [limit]
        )
        return [{"seq": s, "member": m, "text": t} for s, m, t in reversed(list(rows))]

    def on_alarm(self) -> None:
        """Forget old lines; come back when the oldest remaining one expires."""
        self.db.execute("DELETE FROM lines WHERE at <= ?", [self.now() - self.keep_seconds])
        oldest = self.db.execute("SELECT min(at) FROM lines").fetchone()[0]
        if oldest is not None:
            self.set_alarm(oldest + self.keep_seconds)


class Member(CellActor):
    """One member's inbox of lines from every room they are in."""

    def on_activate(self) -> None:
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS inbox (room TEXT NOT NULL, seq INTEGER NOT NULL, "
            "sender TEXT NOT NULL, text TEXT NOT NULL, PRIMARY KEY (room, seq))"
        )

    def deliver(self, room: str, seq: int, sender: str, text: str) -> None:
        self.db.execute(
            "INSERT INTO inbox (room, seq, sender, text) VALUES (?, ?, ?, ?)",
            [room, seq, sender, text],
        )

    @read_only
    def inbox(self) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT room, seq, sender, text FROM inbox ORDER BY room, seq")
        return [{"room": r, "seq": s, "sender": f, "text": t} for r, s, f, t in rows]


class ChatRoom(CellActor):
    """A room of WebSockets (``GET /cells/ChatRoom/{room}/ws``): see the module."""

    #: How many recent lines a new socket gets, and how long a line may be.
    history_lines = 50
    max_text = 500

    def on_activate(self) -> None:
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS chat (seq INTEGER PRIMARY KEY, msg_id TEXT UNIQUE, "
            "name TEXT NOT NULL, text TEXT NOT NULL)"
        )

    def on_connect(self, conn: Connection) -> None:
        name = _name_of(conn.tags)
        conn.attachment = name
        history = {"type": "history", "lines": self.lines(self.history_lines)}
        conn.send(json.dumps({**history, "online": self.who()}))
        self.broadcast(json.dumps({"type": "joined", "name": name, "online": self.who()}))

    def on_message(self, conn: Connection, data: str | bytes) -> None:
        if isinstance(data, bytes):
            conn.close(3003, "this room takes text frames")  # on_close does not run for it
            self.on_close(conn, 3003, "")
            return
        try:
            message = json.loads(data)
        except ValueError:
            message = {"text": data}
        if not isinstance(message, dict):
            message = {"text": str(message)}
        text = str(message.get("text", "")).strip()[: self.max_text]
        msg_id = message.get("id")
        if not isinstance(msg_id, str) or not 0 < len(msg_id) <= 64:
            msg_id = None  # no id: a resent copy would be stored again
        if not text:
            return
        cur = self.db.execute(
            "INSERT OR IGNORE INTO chat (msg_id, name, text) VALUES (?, ?, ?)",
            [msg_id, conn.attachment, text],
        )
        if cur.rowcount == 0:
            return  # sent again after a drop: stored, and sent to everyone, the first time
        line = {"seq": cur.lastrowid, "id": msg_id, "name": conn.attachment, "text": text}
        self.broadcast(json.dumps({"type": "line", **line}))

    def on_close(self, conn: Connection, code: int, reason: str) -> None:
        self.broadcast(json.dumps({"type": "left", "name": conn.attachment, "online": self.who()}))

    @read_only
    def lines(self, limit: int = 50) -> list[dict[str, Any]]:
        """The room's last ``limit`` lines, oldest first."""
        rows = self.db.execute(
            "SELECT seq, msg_id, name, text FROM chat ORDER BY seq DESC LIMIT ?", [limit]
        )
        return [{"seq": s, "id": i, "name": n, "text": t} for s, i, n, t in reversed(list(rows))]

    @read_only
    def who(self) -> list[str]:
        """The names of the sockets open on the room, in the order they joined."""
        return [str(c.attachment) for c in self.connections()]


def _name_of(tags: tuple[str, ...]) -> str:
    """The name a socket gave in a ``name:<name>`` tag (``guest`` without one)."""
    for tag in tags:
        if tag.startswith("name:") and tag[5:].strip():
            return tag[5:].strip()[:32]
    return "guest"
