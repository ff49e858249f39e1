"""The verdict of ``cellactors qualify``: the probes' reports as an exit code, a closing
line and the detail lines before it (the exit codes are the command's own, in
:mod:`cellactors.cli.failures`)."""

from __future__ import annotations

from dataclasses import dataclass

from cellactors.cli.failures import EXIT_CONFIG, EXIT_FAILURE, EXIT_OK
from cellactors.persistence.store.qualify import ContractReport, HammerReport, ListingReport

#: The store qualifies.
EXIT_QUALIFIED = EXIT_OK
#: The store broke the contract, or its listings lag.
EXIT_DISQUALIFIED = EXIT_FAILURE
#: The run could not complete.
EXIT_INCOMPLETE = EXIT_CONFIG


@dataclass(frozen=True)
class Verdict:
    """The exit code of a qualification run, its closing line, and the lines before it."""

    code: int
    line: str
    details: tuple[str, ...] = ()


_LISTED = 8  # bad rounds named in the closing line; the detail lines name them all


def _shorten(text: str, limit: int = 240) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def verdict(
    contract: ContractReport,
    hammer: HammerReport | None,
    listing: ListingReport | None = None,
) -> Verdict:
    """Map the reports to an exit code: 2 incomplete, 1 contract broken (or listings that
    lag), 0 qualified.

    ``hammer`` is None when the hammer did not run (a gs:// bucket); the verdict says so.
    ``listing`` is None when the listing check did not run (the contract could not
    complete). An incomplete run wins over a broken contract: a round with an ambiguous
    write has no countable winners, and the caller must know the run stopped.
    """
    details: list[str] = contract.failures()
    if listing is not None:
        details.extend(f"listing: {p}" for p in listing.problems)
        if listing.error is not None:
            details.append(f"listing check could not complete: {listing.error}")
    if hammer is not None:
        details.extend(r.describe() for r in hammer.bad_rounds)
        if hammer.error is not None:
            details.append(f"hammer could not complete: {hammer.error}")

    reasons = [contract.error] if contract.error is not None else []
    if listing is not None and listing.error is not None:
        reasons.append(listing.error)
    if hammer is not None and hammer.error is not None:
        reasons.append(hammer.error)
    elif hammer is not None and not hammer.completed:
        reasons.append(f"the hammer stopped after {len(hammer.results)} rounds")
    if reasons:
        return Verdict(
            EXIT_INCOMPLETE,
            f"NOT QUALIFIED (exit 2): the run could not complete: {_shorten(reasons[0])}",
            tuple(details),
        )
    broken_steps = [s.name for s in contract.steps if not s.ok]
    bad = hammer.bad_rounds if hammer is not None else []
    lagging = list(listing.problems) if listing is not None else []
    if broken_steps or bad:
        parts: list[str] = []
        if broken_steps:
            parts.append(f"contract broken at {', '.join(broken_steps)}")
        if bad:
            listed = ", ".join(f"{r.phase} {r.number}: {r.winners}" for r in bad[:_LISTED])
            more = f", and {len(bad) - _LISTED} more" if len(bad) > _LISTED else ""
            parts.append(f"{len(bad)} rounds without exactly one winner ({listed}{more})")
        return Verdict(
            EXIT_DISQUALIFIED,
            "NOT QUALIFIED (exit 1): " + "; ".join(parts) + "; this store cannot fence cells",
            tuple(details),
        )
    if lagging:
        return Verdict(
            EXIT_DISQUALIFIED,
            f"NOT QUALIFIED (exit 1): listings lag behind writes ({len(lagging)} listings "
            "missed a write just answered or showed a delete just answered); a takeover "
            "after a crash restores from a listing and would seal acknowledged writes away",
            tuple(details),
        )
    if hammer is None:
        return Verdict(
            EXIT_QUALIFIED,
            "QUALIFIED (exit 0): the sequential contract held; only the contract ran, the "
            "concurrency hammer speaks the S3 dialect and was not run for this bucket",
            tuple(details),
        )
    return Verdict(
        EXIT_QUALIFIED,
        f"QUALIFIED (exit 0): the sequential contract held and all {2 * hammer.rounds} "
        f"rounds of {hammer.writers} writers had exactly one winner",
        tuple(details),
    )
