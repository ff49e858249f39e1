"""``python -m bench``: run the benchmark suite (see :mod:`bench.suite`)."""

from bench.suite import main

if __name__ == "__main__":
    main()
