"""What the steps measured: the second stage of the analysis.

In: the ``Timeline`` (``analysis/trace/``) and the ``RunRecord`` (``diagnose/record.py``).
Out: values with units, no verdict: ``breakdown.compute_breakdown(timeline) -> Breakdown`` (every
microsecond of every step by phase and by what limited it, named in ``categories``);
``kernels`` (the top kernels and their roofline), ``collectives`` (communication by kind),
``ranks`` (a rank's summary, the job's ranks side by side), ``hardware`` (the GPU table),
``memory_breakdown`` (memory by owner), ``hardware_limits`` (the distance to the GPU's limits),
``profcost`` (the profiler's own cost, for a trace without its record), ``wholerun`` (the whole
run's wall-clock, ``diagnose watch``), ``workers`` (how many DataLoader workers build at once on
the run's CPUs).

May import: ``analysis/trace/``, ``diagnose.record``, the ground floor (``units``, ``errors``);
never the symptoms, the prediction, the verdict or the report, which read this stage.
"""
