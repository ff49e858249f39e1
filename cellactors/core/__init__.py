"""The pure decision core: what to do after each read or write result.

Nothing here does I/O, starts threads or reads clocks; callers pass the time in. The actors
in :mod:`cellactors.actors` are thin shells that perform the I/O these functions ask for.
"""
