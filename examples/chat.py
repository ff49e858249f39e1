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
"""

from __future__ import annotations

from typing import Any

from cellactors import CellActor, read_only


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
