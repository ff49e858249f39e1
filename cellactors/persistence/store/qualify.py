"""Store qualification: does this bucket fence the way the fleet protocol needs?

Three checks:

- :func:`run_contract`, the sequential contract: conditional create, conditional overwrite
  and read-after-write, four steps on one probe key. Both dialects. ``cellactors serve``
  runs it at startup and refuses to start when it fails.
- :func:`run_listing`, list-after-write and list-after-delete: every object is in the very
  next listing after its PUT answered (across pages of two), and gone from the next one
  after its DELETE answered. A takeover after a crash restores from a listing, so a store
  whose listings lag would have acknowledged writes sealed away. Both dialects.
- :func:`run_hammer`, the concurrency hammer (S3 dialect): rounds of writers released
  together by a barrier, each racing one conditional PUT; exactly one must win.

:func:`verdict` maps the reports to the exit codes of ``cellactors qualify``: 0 qualified,
1 the store answered but broke the contract (a round without exactly one winner),
2 the run could not complete (including a conditional PUT answered with anything but a
precondition failure). Every probe key lives under ``probe/<run id>/`` and is deleted
afterwards, also on failure.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from cellactors.core.keys import PROBE_PREFIX
from cellactors.persistence.store.bucket import Absent, Applied, Bucket, Guard, Match, Rejected

# Writers wait at most this long for each other at a round's barrier; a writer that cannot
# even get there means the run cannot complete (it never blocks a round forever).
BARRIER_TIMEOUT_S = 60.0

CONTRACT_STEPS = ("create", "create-again", "update", "update-stale")


def new_run_id() -> str:
    """A random id that keeps concurrent qualification runs apart."""
    return secrets.token_hex(8)


def probe_root(run_id: str) -> str:
    """The key folder every probe object of one run lives under."""
    return f"{PROBE_PREFIX}{run_id}/"


def _same_token(a: str, b: str) -> bool:
    """Tokens compare equal whatever the ETag quoting (GCS generations carry none)."""
    return a.strip('"') == b.strip('"')


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------- contract


@dataclass(frozen=True)
class ContractStep:
    """One step of the sequential contract and whether the store kept it."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class ContractReport:
    """The sequential contract's outcome.

    ``error`` is set when the run could not complete (the store failed to answer a step
    with Applied or Rejected), and ``cause`` is the exception that stopped it, so a caller
    can tell missing credentials or an unreachable store from a store that misbehaves;
    ``steps`` holds the steps that did complete.
    """

    steps: tuple[ContractStep, ...]
    error: str | None = None
    cause: BaseException | None = field(default=None, compare=False, repr=False)

    @property
    def completed(self) -> bool:
        """The store answered every step it was asked (it may still have broken one)."""
        return self.error is None

    @property
    def ok(self) -> bool:
        """True only when all four steps ran and held."""
        return (
            self.completed
            and len(self.steps) == len(CONTRACT_STEPS)
            and all(step.ok for step in self.steps)
        )

    def failures(self) -> list[str]:
        """Human-readable lines for every broken step (and the error, if any)."""
        lines = [f"contract step {s.name}: {s.detail}" for s in self.steps if not s.ok]
        if self.error is not None:
            lines.append(f"contract could not complete: {self.error}")
        return lines

    def summary(self) -> str:
        """One line: what held, or what broke first."""
        if self.ok:
            return f"contract held ({len(self.steps)} steps)"
        return "; ".join(self.failures())


def _check_read(bucket: Bucket, key: str, body: bytes, token: str | None) -> str | None:
    """Read ``key`` back; return what is wrong with it, or None when it is as expected."""
    got = bucket.get(key)
    if got is None:
        return "a read right after the write found no object"
    if got.body != body:
        return "a read right after the write returned other bytes"
    if token is not None and not _same_token(got.token, token):
        return f"a read returned token {got.token}, the write answered {token}"
    return None


def run_contract(bucket: Bucket, run_id: str | None = None) -> ContractReport:
    """Run the four-step sequential contract on a fresh probe key, then delete the key.

    1. create on an absent key is Applied; 2. create again is Rejected; 3. update with the
    current token is Applied; 4. update with the stale token is Rejected. A read follows
    every step and must return the last applied bytes (a rejected write must not land).
    Every body is unique, because S3 ETags are content hashes (the ABA problem). The
    contract stops at the first step whose outcome leaves nothing sound to build on.
    """
    rid = run_id or new_run_id()
    key = probe_root(rid) + "contract.json"
    steps: list[ContractStep] = []
    error: str | None = None
    cause: BaseException | None = None
    try:
        _contract_steps(bucket, key, rid, steps)
    except Exception as exc:  # a step the store did not answer: the run could not complete
        error, cause = _describe(exc), exc
    finally:
        cleanup_errors = cleanup_probe(bucket, rid, known=[key])
    if error is None and cleanup_errors:
        error = "; ".join(cleanup_errors)
    return ContractReport(tuple(steps), error, cause)


def _contract_steps(bucket: Bucket, key: str, rid: str, steps: list[ContractStep]) -> None:
    """The steps of :func:`run_contract`, appended to ``steps`` as they complete."""

    def body(step: str) -> bytes:
        return f"probe {rid} step {step} nonce {secrets.token_hex(8)}".encode()

    def record(name: str, problem: str | None, good: str) -> bool:
        steps.append(ContractStep(name, problem is None, problem or good))
        return problem is None

    first = body("create")
    res = bucket.put_cas(key, first, Absent())
    if not isinstance(res, Applied):
        record("create", f"create on an absent key was {res}", "")
        return
    if not record("create", _check_read(bucket, key, first, res.token), "Applied"):
        return

    res = bucket.put_cas(key, body("create-again"), Absent())
    problem = _check_read(bucket, key, first, None)
    if isinstance(res, Applied):
        problem = "create on an existing key was Applied (If-None-Match not enforced)"
    record("create-again", problem, "Rejected")

    current = bucket.get(key)
    if current is None:
        record("update", "the probe object vanished before the update", "")
        return
    second = body("update")
    res = bucket.put_cas(key, second, Match(current.token))
    if not isinstance(res, Applied):
        record("update", f"update with the current token was {res}", "")
        return
    if not record("update", _check_read(bucket, key, second, res.token), "Applied"):
        return

    res = bucket.put_cas(key, body("update-stale"), Match(current.token))
    problem = _check_read(bucket, key, second, None)
    if isinstance(res, Applied):
        problem = "update with a stale token was Applied (If-Match not enforced)"
    record("update-stale", problem, "Rejected")


# --------------------------------------------------------------------------- listing

LISTING_OBJECTS = 5
LISTING_PAGE = 2  # small pages, so that every listing after the second PUT has several


@dataclass(frozen=True)
class ListingReport:
    """List-after-write and list-after-delete: ``problems`` names every listing that
    missed an object just written or showed one just deleted; ``error`` is set when the
    run could not complete."""

    listings: int
    problems: tuple[str, ...] = ()
    error: str | None = None
    cause: BaseException | None = field(default=None, compare=False, repr=False)

    @property
    def completed(self) -> bool:
        return self.error is None

    @property
    def ok(self) -> bool:
        return self.completed and not self.problems

    def summary(self) -> str:
        if self.ok:
            return f"listings showed every write and delete at once ({self.listings} listings)"
        if self.problems:
            return f"listings lag: {self.problems[0]}"
        return f"listing check could not complete: {self.error}"


def run_listing(
    bucket: Bucket, run_id: str | None = None, objects: int = LISTING_OBJECTS
) -> ListingReport:
    """Write ``objects`` probe objects one at a time, listing (in pages of
    :data:`LISTING_PAGE`) after each PUT answered: every object written so far must be
    there. Then delete them one at a time, listing after each DELETE answered: none deleted
    may be. Probe keys are deleted afterwards, also on failure."""
    rid = run_id or new_run_id()
    root = probe_root(rid) + "list/"
    written: list[str] = []
    problems: list[str] = []
    listings = 0

    def listed() -> list[str]:
        nonlocal listings
        listings += 1
        return [info.key for page in bucket.list_pages(root, LISTING_PAGE) for info in page]

    error: str | None = None
    cause: BaseException | None = None
    try:
        for i in range(objects):
            key = f"{root}{i:04d}"
            bucket.put(key, f"probe {rid} listing {i}".encode())
            written.append(key)
            seen = listed()
            missing = [k for k in written if k not in seen]
            if missing:
                problems.append(
                    f"the listing right after PUT {key} answered lacks {', '.join(missing)}"
                )
        for i, key in enumerate(written):
            bucket.delete(key)
            seen = listed()
            still = [k for k in written[: i + 1] if k in seen]
            if still:
                problems.append(
                    f"the listing right after DELETE {key} answered still shows {', '.join(still)}"
                )
    except Exception as exc:
        error, cause = _describe(exc), exc
    finally:
        cleanup = cleanup_probe(bucket, rid, known=written)
    if error is None and cleanup:
        error = "; ".join(cleanup)
    return ListingReport(listings, tuple(problems), error, cause)


# --------------------------------------------------------------------------- hammer


@dataclass(frozen=True)
class RoundResult:
    """One round of the hammer: how many of the racing writers won.

    ``problem`` names a stored object that is not the winner's write; ``errors`` lists
    writers whose conditional PUT got neither Applied nor Rejected.
    """

    phase: str
    number: int
    winners: int
    rejected: int
    errors: tuple[str, ...] = ()
    problem: str | None = None

    @property
    def held(self) -> bool:
        """Exactly one winner, and its write is what the store now holds."""
        return not self.errors and self.winners == 1 and self.problem is None

    def describe(self) -> str:
        text = f"{self.phase} round {self.number}: {self.winners} winners"
        if self.problem:
            text += f" ({self.problem})"
        return text


@dataclass
class HammerReport:
    """The concurrency hammer's outcome over its create and update phases."""

    writers: int
    rounds: int
    results: list[RoundResult] = field(default_factory=list)
    error: str | None = None

    @property
    def completed(self) -> bool:
        return self.error is None and len(self.results) == 2 * self.rounds

    @property
    def bad_rounds(self) -> list[RoundResult]:
        """Rounds that ran to the end without exactly one (true) winner."""
        return [r for r in self.results if not r.errors and not r.held]

    @property
    def ok(self) -> bool:
        return self.completed and not self.bad_rounds


ProgressCallback = Callable[[RoundResult], None]


def _race(
    pool: ThreadPoolExecutor,
    bucket: Bucket,
    key: str,
    bodies: list[bytes],
    guard: Guard,
) -> list[Applied | Rejected | BaseException]:
    """Release one writer per body together and return each one's outcome."""
    barrier = threading.Barrier(len(bodies))

    def writer(body: bytes) -> Applied | Rejected | BaseException:
        try:
            barrier.wait(BARRIER_TIMEOUT_S)
            return bucket.put_cas(key, body, guard)
        except Exception as exc:
            return exc

    futures = [pool.submit(writer, body) for body in bodies]
    return [f.result() for f in futures]


def _score(
    bucket: Bucket,
    phase: str,
    number: int,
    key: str,
    bodies: list[bytes],
    outcomes: list[Applied | Rejected | BaseException],
) -> RoundResult:
    """Count winners, and check that a lone winner's write is what the store holds."""
    winners = [i for i, o in enumerate(outcomes) if isinstance(o, Applied)]
    rejected = sum(isinstance(o, Rejected) for o in outcomes)
    errors = tuple(
        f"{phase} round {number} writer {i + 1}: {_describe(o)}"
        for i, o in enumerate(outcomes)
        if isinstance(o, BaseException)
    )
    problem: str | None = None
    if not errors and len(winners) == 1:
        win = outcomes[winners[0]]
        assert isinstance(win, Applied)
        problem = _check_read(bucket, key, bodies[winners[0]], win.token)
        if problem is not None:
            problem = f"the winner's write is not what the store holds: {problem}"
    return RoundResult(phase, number, len(winners), rejected, errors, problem)


def run_hammer(
    bucket: Bucket,
    writers: int = 8,
    rounds: int = 32,
    progress: ProgressCallback | None = None,
    run_id: str | None = None,
) -> HammerReport:
    """Race ``writers`` conditional PUTs per round and count the winners.

    Create phase: every round races If-None-Match creates of a fresh key. Update phase:
    every round reads the seed object's token once, then races If-Match updates with it.
    Bodies are unique (ETags are content hashes). The run stops after the first round in
    which any writer got something other than Applied or Rejected. ``progress`` is called
    after each round. Probe keys are deleted afterwards, also on failure.
    """
    if writers < 2 or rounds < 1:
        raise ValueError("the hammer needs at least 2 writers and 1 round")
    rid = run_id or new_run_id()
    root = probe_root(rid)
    report = HammerReport(writers, rounds)
    known: list[str] = []

    def bodies(phase: str, number: int) -> list[bytes]:
        return [
            f"{rid} {phase} round {number} writer {w + 1} {secrets.token_hex(8)}".encode()
            for w in range(writers)
        ]

    def finish(result: RoundResult) -> bool:
        report.results.append(result)
        if progress is not None:
            progress(result)
        if result.errors:
            report.error = "; ".join(result.errors)
            return False
        return True

    try:
        with ThreadPoolExecutor(max_workers=writers, thread_name_prefix="qualify") as pool:
            for number in range(1, rounds + 1):
                key = f"{root}create/{number:04d}"
                known.append(key)
                batch = bodies("create", number)
                outcomes = _race(pool, bucket, key, batch, Absent())
                if not finish(_score(bucket, "create", number, key, batch, outcomes)):
                    return report

            seed = f"{root}update/seed"
            known.append(seed)
            bucket.put(seed, f"{rid} seed {secrets.token_hex(8)}".encode())
            for number in range(1, rounds + 1):
                info = bucket.head(seed)
                if info is None:
                    report.error = f"update round {number}: the seed object vanished"
                    return report
                batch = bodies("update", number)
                outcomes = _race(pool, bucket, seed, batch, Match(info.token))
                if not finish(_score(bucket, "update", number, seed, batch, outcomes)):
                    return report
    except Exception as exc:
        report.error = _describe(exc)
    finally:
        cleanup = cleanup_probe(bucket, rid, known=known)
        if cleanup and report.error is None:
            report.error = "; ".join(cleanup)
    return report


# --------------------------------------------------------------------------- cleanup


def cleanup_probe(bucket: Bucket, run_id: str, known: Iterable[str] = ()) -> list[str]:
    """Delete every object under ``probe/<run_id>/``; return what could not be deleted.

    Listed keys and the keys the caller knows it wrote are both deleted, so a failing
    listing still removes what it can.
    """
    root = probe_root(run_id)
    errors: list[str] = []
    keys = set(known)
    try:
        keys.update(info.key for info in bucket.list(root))
    except Exception as exc:
        errors.append(f"cleanup: listing {root} failed: {_describe(exc)}")
    for key in sorted(keys):
        try:
            bucket.delete(key)
        except Exception as exc:
            errors.append(f"cleanup: deleting {key} failed: {_describe(exc)}")
    return errors
