"""free_port: the kernel's choice by default; with CELLACTORS_PORT_RANGE, the next bindable
port of the range, not handed out again before the range wraps."""

from __future__ import annotations

import socket

import pytest

from cellactors.errors import ConfigError
from cellactors.persistence.store.embedded import PORT_RANGE_ENV, free_port


def test_ports_come_from_the_range_in_turn_skipping_taken_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Above every test worker's own block, below the kernel's ephemeral range.
    monkeypatch.setenv(PORT_RANGE_ENV, "32700-32703")
    first = free_port()
    held = 32700 + (first - 32700 + 1) % 4
    with socket.socket() as taken:  # the port after it is taken by a listener
        taken.bind(("127.0.0.1", held))
        taken.listen()
        ports = [first, free_port(), free_port()]
    assert len(set(ports)) == 3 and all(32700 <= p <= 32703 for p in ports)
    assert held not in ports


def test_a_full_range_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv(PORT_RANGE_ENV, f"{port}-{port}")
        with pytest.raises(ConfigError, match="no free port"):
            free_port()


def test_without_a_range_the_kernel_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PORT_RANGE_ENV)
    assert free_port() >= 32768  # the kernel's ephemeral range on Linux
