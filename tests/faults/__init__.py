"""Fault injection: real ``cellactors serve`` processes talking to SeaweedFS through a
:class:`~tests.faults.proxy.FaultProxy` each, and a ledger checker for what they
acknowledged."""
