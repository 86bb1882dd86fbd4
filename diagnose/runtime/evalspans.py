"""Evaluation passes inside the profiled window: ``model.eval()`` ... ``model.train()``.

A script that evaluates inside every training step (a full-batch graph network's validation
forward after each optimizer step, a loop that prints a validation loss each iteration) spends
part of each step on a forward pass that no backward follows. The trace shows it as other host
work (its operators start no forward-to-backward flow), which reads like preprocessing in the
training loop; the run knows better: the model was put into eval mode and back.

Contract: ``EvalSpans(trained)`` where ``trained()`` is a count that grows at every backward and
optimizer step; ``start()`` patches ``nn.Module.train`` (``eval()`` calls it) for the window,
``stop()`` undoes the patch and keeps the spans closed inside it: from a module's outermost
``train(False)`` to its next ``train(True)``, each a ``(start, end)`` pair of
``time.perf_counter()`` seconds (the clock of ``RunRecord.boundaries_s``). A span in which
``trained()`` grew is training with a module frozen in eval mode (a GAN's discriminator while the
generator learns), never an evaluation pass, and is dropped. Outside the window nothing is
patched: ``model.train()`` runs over every submodule, and the HF Trainer calls it every step.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from diagnose.runtime.patching import wrap_attribute

#: the most spans kept (a window of a few dozen steps holds a few dozen)
MAX_SPANS = 4096


class EvalSpans:
    def __init__(self, trained: Callable[[], int]) -> None:
        self.trained = trained
        self.spans: list[tuple[float, float]] = []
        self._open: dict[int, tuple[float, int]] = {}
        self._depth = 0
        self._undo: Callable[[], None] | None = None
        self._pid = os.getpid()

    def start(self) -> None:
        if self._undo is not None:
            return
        from torch import nn

        self._undo = wrap_attribute(nn.Module, "train", self._wrap)

    def stop(self) -> list[tuple[float, float]]:
        """Undo the patch; the spans closed while it was in place."""
        if self._undo is not None:
            self._undo()
            self._undo = None
        self._open.clear()
        return list(self.spans)

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        spans = self

        def train(module: Any, mode: bool = True) -> Any:
            if spans._depth or os.getpid() != spans._pid:  # a submodule of the call, a forked worker
                return original(module, mode)
            spans._note(id(module), bool(mode), time.perf_counter())
            spans._depth += 1
            try:
                return original(module, mode)
            finally:
                spans._depth -= 1

        train.__wrapped__ = original  # type: ignore[attr-defined]
        return train

    def _note(self, key: int, mode: bool, now: float) -> None:
        if not mode:
            self._open.setdefault(key, (now, self.trained()))
            return
        opened = self._open.pop(key, None)
        if opened is None:
            return
        start, count = opened
        if self.trained() == count and len(self.spans) < MAX_SPANS:
            self.spans.append((start, now))
