"""The cellactors benchmark suite: ``python -m bench`` (``--quick``, ``--json out.json``).

Every row is measured together with its baseline in the same run, against an embedded
SeaweedFS the suite starts itself; each figure is the median of several runs. The suite
prints numbers and ratios to the goals in ``docs/performance.md``; it asserts nothing.
"""
