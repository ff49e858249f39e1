"""Fault injection: real ``cellactors serve`` processes, each talking to SeaweedFS through
its own :class:`~tests.faults.proxy.FaultProxy`, and a ledger checker
(:mod:`tests.faults.ledger`) for what they acknowledged.

Every test here carries the ``faults`` marker: ``tox -e faults`` runs them (about four
minutes on two cores); the default tox environments skip them (``-m "not faults"``). Tests
marked ``xfail(strict=True)`` describe behaviour the runtime does not have yet, or a bug it
has; each reason says which.
"""
