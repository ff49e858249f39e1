"""The ledger checker: what the fleet acknowledged must be exactly what the bucket keeps.

Writers append unique entries to ``Ledger`` cells (the app of ``tests/helpers/fleet.py``)
through the nodes' public HTTP and record every attempt: acknowledged (HTTP 200), or an
error with the outcome its body states (``not_run`` | ``unknown`` | ``failed``). The checker
then reads each ledger twice, live through a node's ``entries`` method and through
``cellactors restore`` (a read-only rebuild into a SQLite file), and fails on:

- an acknowledged entry missing;
- acknowledged entries of one sequential writer out of acknowledgement order;
- a duplicate entry, or an entry nobody sent;
- an entry present although its error said ``not_run`` (never ran) or ``failed`` (ran and
  was rolled back: an append only fails on its UNIQUE entry, i.e. when it ran twice);
- a live read that is not a prefix of the restored ledger;

and, from the proxies' logs of ``own.json`` PUTs the store applied, on one epoch of a cell
written with two node ids, or epochs not strictly increasing in the order the store applied
them (the chain of If-None-Match/If-Match guards and ETags gives that order exactly).
"""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from cellactors.core import keys
from tests.faults.proxy import Request
from tests.helpers.fleet import NODE_HEADER, ledger_entries

NOT_RUN, UNKNOWN, FAILED = "not_run", "unknown", "failed"
_restores = itertools.count()


@dataclass(frozen=True)
class Attempt:
    """One append and how it ended. Times are ``time.time()``.

    ``outcome`` is None for an acknowledgement, else what the error body said; a transport
    error is ``not_run`` when the connection could not even be opened (nothing was sent),
    else ``unknown``.
    """

    entry: str
    sequence: str
    url: str
    sent: float
    done: float
    status: int | None
    node: str
    outcome: str | None
    error: str = ""

    @property
    def acked(self) -> bool:
        return self.status == 200


def _outcome(resp: httpx.Response) -> str:
    try:
        value = resp.json()
    except ValueError:
        return "?"
    outcome = value.get("outcome") if isinstance(value, dict) else None
    return outcome if isinstance(outcome, str) else "?"


class Ledger:
    """Every append to one ``Ledger`` cell, from writers and one-off calls alike."""

    def __init__(self, cell: str) -> None:
        self.cell = cell
        self._lock = threading.Lock()
        self._attempts: list[Attempt] = []
        self._writers: list[LedgerWriter] = []

    def append(
        self,
        url: str,
        entry: str,
        *,
        sequence: str | None = None,
        timeout: float = 40.0,
        client: httpx.Client | None = None,
    ) -> Attempt:
        """POST one append and record how it ended (never raises for call failures)."""
        sent = time.time()
        target = f"{url}/cells/Ledger/{self.cell}/append"
        try:
            if client is None:
                resp = httpx.post(target, json={"entry": entry}, timeout=timeout)
            else:
                resp = client.post(target, json={"entry": entry})
        except (httpx.ConnectError, httpx.ConnectTimeout) as err:
            attempt = Attempt(
                entry, sequence or entry, url, sent, time.time(), None, "", NOT_RUN, repr(err)
            )
        except httpx.HTTPError as err:
            attempt = Attempt(
                entry, sequence or entry, url, sent, time.time(), None, "", UNKNOWN, repr(err)
            )
        else:
            node = resp.headers.get(NODE_HEADER, "")
            ok = resp.status_code == 200
            attempt = Attempt(
                entry,
                sequence or entry,
                url,
                sent,
                time.time(),
                resp.status_code,
                node,
                None if ok else _outcome(resp),
                "" if ok else resp.text[:300],
            )
        with self._lock:
            self._attempts.append(attempt)
        return attempt

    def writer(
        self,
        urls: Callable[[], list[str]],
        tag: str,
        *,
        timeout: float = 40.0,
        pause: float = 0.0,
    ) -> LedgerWriter:
        """A started sequential writer appending ``<tag>-<i>`` through ``urls()``."""
        writer = LedgerWriter(self, urls, tag, timeout, pause)
        self._writers.append(writer)
        return writer.start()

    def stop_writers(self, timeout: float = 60.0) -> None:
        for writer in self._writers:
            writer.stop(timeout)

    def attempts(self) -> list[Attempt]:
        with self._lock:
            return list(self._attempts)

    def acked(self) -> list[Attempt]:
        return [a for a in self.attempts() if a.acked]

    def acked_after(self, t: float) -> list[Attempt]:
        """Acknowledgements received after wall time ``t``."""
        return [a for a in self.acked() if a.done > t]

    def errors(self) -> list[Attempt]:
        return [a for a in self.attempts() if not a.acked]


@dataclass
class LedgerWriter:
    """A thread appending ``<tag>-0``, ``<tag>-1``, ... one at a time, round-robin over
    ``urls()``; each attempt is recorded in the ledger under sequence ``tag``."""

    ledger: Ledger
    urls: Callable[[], list[str]]
    tag: str
    timeout: float = 40.0
    pause: float = 0.0
    stop_event: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    sent: int = 0

    def start(self) -> LedgerWriter:
        self.thread = threading.Thread(target=self._run, name=f"ledger-{self.tag}", daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        with httpx.Client(timeout=httpx.Timeout(self.timeout, connect=1.0)) as client:
            while not self.stop_event.is_set():
                urls = self.urls()
                if not urls:
                    self.stop_event.wait(0.05)
                    continue
                url = urls[self.sent % len(urls)]
                entry = f"{self.tag}-{self.sent}"
                self.sent += 1
                attempt = self.ledger.append(url, entry, sequence=self.tag, client=client)
                if not attempt.acked:
                    self.stop_event.wait(0.05)
                elif self.pause:
                    self.stop_event.wait(self.pause)

    def acked(self) -> list[Attempt]:
        return [a for a in self.ledger.acked() if a.sequence == self.tag]

    def stop(self, timeout: float = 60.0) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(timeout)
            assert not self.thread.is_alive(), f"writer {self.tag} did not stop in {timeout:g}s"


# --------------------------------------------------------------------------- checks


def entry_violations(source: str, entries: list[str], attempts: Iterable[Attempt]) -> list[str]:
    """What is wrong with ``entries`` (one read of a ledger) given the attempts made."""
    attempts = list(attempts)
    problems: list[str] = []
    by_entry = {a.entry: a for a in attempts}
    position = {e: i for i, e in enumerate(entries)}
    dupes = sorted(e for e, n in Counter(entries).items() if n > 1)
    if dupes:
        problems.append(f"{source}: duplicate entries {dupes[:20]}")
    strangers = [e for e in entries if e not in by_entry]
    if strangers:
        problems.append(f"{source}: entries nobody sent {strangers[:20]}")
    missing = [a.entry for a in attempts if a.acked and a.entry not in position]
    if missing:
        problems.append(f"{source}: acknowledged but missing {missing[:20]} ({len(missing)})")
    for outcome in (NOT_RUN, FAILED):
        ghosts = [a for a in attempts if a.outcome == outcome and a.entry in position]
        if ghosts:
            problems.append(
                f"{source}: present although the error said {outcome}: "
                + "; ".join(f"{a.entry} ({a.status} {a.error[:160]})" for a in ghosts[:10])
            )
    sequences: dict[str, list[Attempt]] = defaultdict(list)
    for a in attempts:
        if a.acked and a.entry in position:
            sequences[a.sequence].append(a)
    for seq, acked in sequences.items():
        acked.sort(key=lambda a: a.done)
        order = [position[a.entry] for a in acked]
        bad = [
            (acked[i].entry, acked[i + 1].entry)
            for i in range(len(order) - 1)
            if order[i] >= order[i + 1]
        ]
        if bad:
            problems.append(f"{source}: writer {seq} acknowledged out of ledger order: {bad[:10]}")
    return problems


def _etag(token: str | None) -> str | None:
    return token.strip().strip('"') if token else None


def ownership_violations(requests: Iterable[Request]) -> list[str]:
    """Check every ``own.json`` PUT the store applied (from all proxies' logs).

    Claims name a node; releases (``node: ""``) keep the epoch of the claim they end. One
    epoch of a cell must be claimed by one node only, every claim must come through the
    proxy of the node it names, and along the store's order of application (each write's
    If-Match is the ETag of the one before it) claim epochs strictly increase and a release
    ends the claim just before it, through the same node's proxy.
    """
    problems: list[str] = []
    writes: dict[str, list[Request]] = defaultdict(list)
    for r in requests:
        if r.kind == "own" and r.method == "PUT" and r.applied:
            writes[r.key].append(r)
    for key, applied in sorted(writes.items()):
        claims: dict[int, set[str]] = defaultdict(set)
        for r in applied:
            record = r.record()
            if record["node"]:
                claims[int(record["epoch"])].add(record["node"])
                if record["node"] != r.proxy:
                    problems.append(f"{key}: {record} written through the proxy of {r.proxy}")
        for epoch, nodes in sorted(claims.items()):
            if len(nodes) > 1:
                problems.append(f"{key}: epoch {epoch} owned by {sorted(nodes)}")
        problems += _chain_violations(key, applied)
    return problems


def _chain_violations(key: str, applied: list[Request]) -> list[str]:
    firsts = [r for r in applied if r.if_none_match == "*"]
    successors: dict[str, list[Request]] = defaultdict(list)
    for r in applied:
        tag = _etag(r.if_match)
        if tag is not None:
            successors[tag].append(r)
    if len(firsts) != 1:
        return [f"{key}: {len(firsts)} creating writes applied (expected exactly one)"]
    chain = [firsts[0]]
    while True:
        tag = _etag(chain[-1].etag)
        nexts = successors.get(tag or "", []) if tag else []
        if len(nexts) > 1:
            return [f"{key}: {len(nexts)} conditional writes applied on one version {tag}"]
        if not nexts or len(chain) > len(applied):
            break
        chain.append(nexts[0])
    problems = []
    if len(chain) != len(applied):
        outside = [r.record() for r in applied if r not in chain]
        problems.append(f"{key}: writes outside the chain of guards: {outside[:10]}")
    last_claim: tuple[int, str] | None = None
    for r in chain:
        record = r.record()
        epoch, node = int(record["epoch"]), str(record["node"])
        if node:
            if last_claim is not None and epoch <= last_claim[0]:
                problems.append(f"{key}: epoch {epoch} by {node} after epoch {last_claim[0]}")
            last_claim = (epoch, node)
        elif last_claim is None or last_claim[0] != epoch or r.proxy != last_claim[1]:
            problems.append(
                f"{key}: release of epoch {epoch} through {r.proxy} after claim {last_claim}"
            )
    return problems


# --------------------------------------------------------------------------- reading


def restore_entries(bucket: str, endpoint: str, cell: str, workdir: Path) -> list[str]:
    """The ledger as ``cellactors restore`` rebuilds it from the bucket ([] when the cell
    has no ownership record at all)."""
    restores = workdir / "restores"
    restores.mkdir(parents=True, exist_ok=True)
    out = restores / keys.local_db_name(f"Ledger:{cell}", next(_restores))  # fits any id
    args = [sys.executable, "-m", "cellactors.cli", "restore", "--bucket", f"s3://{bucket}"]
    args += ["--endpoint", endpoint, "--cell", f"Ledger:{cell}", "--output", str(out)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode == 1 and "no cell" in done.stderr:
        return []
    assert done.returncode == 0, f"cellactors restore failed: {done.stdout}{done.stderr}"
    with contextlib.closing(sqlite3.connect(out)) as conn:
        return [row[0] for row in conn.execute("SELECT entry FROM entries ORDER BY seq")]


def check_ledgers(
    ledgers: Iterable[Ledger],
    *,
    read_urls: list[str],
    bucket: str,
    endpoint: str,
    requests: Iterable[Request],
    workdir: Path,
) -> dict[str, list[str]]:
    """Run every check; AssertionError listing all violations. Returns the live entries of
    each ledger by cell (the restored ones when ``read_urls`` is empty: no node is left)."""
    problems: list[str] = []
    found: dict[str, list[str]] = {}
    for ledger in ledgers:
        attempts = ledger.attempts()
        restored = restore_entries(bucket, endpoint, ledger.cell, workdir)
        problems += entry_violations(f"restored Ledger:{ledger.cell}", restored, attempts)
        live = ledger_entries(read_urls, ledger.cell) if read_urls else restored
        if read_urls:
            problems += entry_violations(f"live Ledger:{ledger.cell}", live, attempts)
        if restored[: len(live)] != live:
            problems.append(
                f"Ledger:{ledger.cell}: the live read ({len(live)} entries) is not a prefix of "
                f"the restore ({len(restored)})"
            )
        found[ledger.cell] = live
    problems += ownership_violations(requests)
    assert not problems, "ledger check failed:\n" + "\n".join(problems)
    return found
