"""The thread pools of one node, made by the node and shut down when it stops.

Every node of a process has its own: two nodes in one process (a test fleet) never share a
thread, and a node that stops leaves none behind. Threads start only as work needs them.

- ``ownership``: ownership actors borrow a thread for an activation, a release or a resume
  at a time. The cap is high so that restores stuck on a hanging store (each bounded by the
  operation deadline) do not queue other cells' releases and hibernations behind them;
  waits on a cell do not count against it (``pool.blocking()``).
- ``replicators``: replicators borrow a thread while they ship a batch.
- ``uploads``: the store requests a replicator waits on with a deadline (a request that
  hangs is abandoned there and holds its thread until it ends).
- ``snapshots``: snapshot uploads and their collection, in the background.
- ``fetches``: the GETs of restores (activations), a window of them in parallel.
- ``feed``: the GETs of change-feed readers served by this node.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass

from cellactors.actors.threadpool import ElasticPool
from cellactors.persistence.history.restore import FETCH_WORKERS


@dataclass(frozen=True)
class NodePools:
    """One node's thread pools (see the module's docstring)."""

    ownership: ElasticPool
    replicators: ElasticPool
    uploads: concurrent.futures.ThreadPoolExecutor
    snapshots: concurrent.futures.ThreadPoolExecutor
    fetches: concurrent.futures.ThreadPoolExecutor
    feed: concurrent.futures.ThreadPoolExecutor

    @classmethod
    def create(cls, name: str, ownership_cap: int = 256) -> NodePools:
        """The pools of node ``name`` (its id names their threads)."""

        def executor(workers: int, what: str) -> concurrent.futures.ThreadPoolExecutor:
            prefix = f"{what}-{name}"
            return concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix=prefix)

        return cls(
            ownership=ElasticPool(ownership_cap, f"ownership-{name}"),
            replicators=ElasticPool(128, f"replicator-{name}"),
            uploads=executor(64, "upload"),
            snapshots=executor(4, "snapshot"),
            fetches=executor(FETCH_WORKERS, "restore"),
            feed=executor(FETCH_WORKERS, "feed"),
        )

    def shutdown(self) -> None:
        """Refuse new work; threads end as their work does (nothing waits for them)."""
        self.ownership.shutdown()
        self.replicators.shutdown()
        for pool in (self.uploads, self.snapshots, self.fetches, self.feed):
            pool.shutdown(wait=False)
