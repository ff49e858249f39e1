"""The browser tests need selenium (the ``browser`` extra, installed by ``tox -e browser``).
Without it they are not collected, so the other environments need not install it; the
browser environment runs ``-m browser`` and fails when nothing is collected."""

from __future__ import annotations

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("selenium") else ["test_*.py"]
