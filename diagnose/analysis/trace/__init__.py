"""Reading a trace: the first stage of the analysis.

In: a torch.profiler (Kineto) Chrome trace, ``.json`` or ``.json.gz``, of any size.
Out: ``timeline.load_timeline(path) -> Timeline`` (sorted intervals, the long ones as compact
``columns``) and its ``TraceMeta``; ``trim.trim_trace`` cuts a trace down to a few steps.

``tracefile`` streams the file in pieces, ``timeline`` folds them (in ``forking`` workers for a
large trace), ``columns`` holds the long sequences, ``vectorized`` does their array work
(numpy), ``patterns`` names the events as data. ``forking`` also serves the later stages.

May import: the standard library, msgspec, numpy, isal, and from diagnose only the ground floor
(``errors``) and ``rundir``; nothing else of the analysis (every later stage reads this one).
"""
