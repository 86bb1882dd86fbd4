"""What a fix would buy, and how sure that is: beside the symptoms, read by the verdict.

In: the ``Timeline`` (``analysis/trace/``), the breakdown's helpers (``analysis/measure/``), the
run's symptom values as plain numbers (``facts``). Out: ``replay.build_model(timeline) ->
StepModel`` (the profiled steps' dependency model) and ``replay(model)``; ``predict``'s
transformations (``model -> model``) and ``Predictor``, a fix's replayed speedup or
``CannotPredict``; ``uncertainty``, the block bootstrap over the steps (intervals, the floor a
change must beat, the ranking's shares).

May import: ``analysis/trace/``, ``analysis/measure/``, the ground floor; never the symptoms
(their values come in as numbers), the verdict or the report.
"""
