"""The analysis side: trace and run record in, report out. Nothing here imports torch.

One folder per stage, in the order the data flows (each folder's ``__init__`` states its
contract; tests/test_layout.py keeps every import pointing down this list):

* ``trace/``: the Kineto trace read into a ``Timeline``;
* ``measure/``: what the steps measured (the breakdown, kernels, limits, ranks, the whole run);
* ``symptoms/`` and, beside it, ``prediction/``: named numbers with units; the replay model and
  what each fix would buy, with its interval;
* ``verdict/``: the rules fired on the symptoms, the findings ranked;
* ``report.py``: the one value every renderer reads (``bare.py``: its section for a trace alone);
* ``pipeline.py`` runs them all (trace and record in, report out); ``compare.py`` and ``gate.py``
  read finished reports (runs side by side, the CI gate).

May import: ``diagnose.record``, ``diagnose.rundir`` and the ground floor; never the runtime
(torch), the renderers or the orchestration above.
"""
