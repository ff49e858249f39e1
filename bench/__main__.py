"""``python -m bench``: run the benchmark suite (see :mod:`bench.suite`); with
``--peer restate``, the side-by-side comparison with Restate (see :mod:`bench.peer_restate`)."""

import sys

from bench.suite import main

if __name__ == "__main__":
    if any(arg == "--peer" or arg.startswith("--peer=") for arg in sys.argv[1:]):
        from bench.peer_restate import main as peer_main

        peer_main(sys.argv[1:])
    else:
        main()
