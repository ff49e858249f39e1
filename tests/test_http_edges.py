"""Edges of the HTTP layer: names that are path segments, JSON constants, requests that die
half way, and failures that must still be answered as JSON with an outcome."""

from __future__ import annotations

import pytest

from cellactors.errors import InvalidCellId
from cellactors.persistence import keys


@pytest.mark.parametrize("name", [".", ".."])
def test_make_cell_id_refuses_dot_names(name: str) -> None:
    with pytest.raises(InvalidCellId, match="cell id"):
        keys.make_cell_id("Counter", name)
    with pytest.raises(InvalidCellId):
        keys.make_cell_id(name, "a")


@pytest.mark.parametrize("name", ["a.", ".a", "...", "a..b", "a:b"])
def test_make_cell_id_keeps_other_dotted_names(name: str) -> None:
    assert keys.make_cell_id("Counter", name) == f"Counter:{name}"
