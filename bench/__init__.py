"""The benches, each run from the checkout's root as ``python -m bench.NAME`` (``--help`` for its options).

What they share, the parser, the timer, seeding and the results file, is :mod:`bench._harness`; the
controlled task's jobs that several benches train are :mod:`bench._controlled_task`."""
