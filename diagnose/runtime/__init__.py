"""The torch side: runs the script in-process, drives the profiler, hooks, lines and knobs.

In: a script (or a block of the caller's code), a ``WindowPlan``, knobs. Out: the ``RunRecord``
(``run.json``), the trace and the workers' samples, written through ``RunDir``.

May import: torch, ``diagnose.record``, ``diagnose.rundir`` and the ground floor; never the
analysis (which never imports this side either: tests/test_layout.py).
"""
