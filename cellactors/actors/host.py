"""A cell as the node sees it: one activation's handle, and the in-process call proxy."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

import pykka

from cellactors.actors.cell import CellActor
from cellactors.actors.ownership import Active
from cellactors.errors import ActivationFailed


class Caller(Protocol):
    """What a call proxy needs: a blocking call of a cell by class and name (the node)."""

    def call(
        self,
        cls_name: str,
        name: str,
        method: str,
        kwargs: dict[str, Any] | None = None,
        *,
        args: tuple[Any, ...] = (),
    ) -> Any: ...


class CellHost:
    """One activation of one cell on this node, from acquire to release."""

    def __init__(self, cell_id: str, cls: type[CellActor]) -> None:
        self.cell_id = cell_id
        self.cls = cls
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.active: Active | None = None
        self.ownership: pykka.ActorRef[Any] | None = None

    def wait(self, timeout: float) -> Active:
        if not self.ready.wait(timeout):
            raise ActivationFailed(f"activation of {self.cell_id} did not finish in {timeout:g}s")
        if self.error is not None:
            raise self.error
        assert self.active is not None
        return self.active


class CellProxy:
    """``node.cell(Counter, "a").increment("x")``: blocking calls answered after the ack."""

    def __init__(self, node: Caller, cls_name: str, name: str) -> None:
        self._node = node
        self._cls = cls_name
        self._name = name

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._node.call(self._cls, self._name, method, kwargs, args=args)

        return call
