"""memtier's benchmark harness: ``python -m bench.run`` (see ``docs/performance.md``).

Every figure is a median over interleaved rounds with its spread, next to its
baseline from the same run as a ratio.  Not part of the installed package.
"""
