"""``python -m cellactors.cli``: the same command as the ``cellactors`` console script."""

from __future__ import annotations

from cellactors.cli import main

if __name__ == "__main__":
    main(prog_name="cellactors")
