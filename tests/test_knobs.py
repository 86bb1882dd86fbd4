"""The knobs for fixes that once said "apply by hand": pinned host tensors and unsynced sites.

Both are checked on the CPU: a ``meta`` device stands in for the GPU as the copy's target, and
CPU tensors stand in for GPU ones at a sync site (the tests pass the knob its device test).
"""

from __future__ import annotations

import pytest
import torch

from diagnose.errors import UsageError
from diagnose.runtime.knobs import PIN_MIN_BYTES, Knobs, parse_sites


@pytest.fixture
def pinned_copies():
    """The pin_host knob installed with a pin that records what it pinned."""
    knobs = Knobs.parse(["pin_host=true"])
    made: list[torch.Tensor] = []

    def pin(t: torch.Tensor) -> torch.Tensor:
        made.append(t)
        return t.clone()

    knobs._patch_pin_host(pin=pin)
    yield made
    knobs.remove()


def test_a_large_host_tensor_is_pinned_once_and_reused(pinned_copies: list[torch.Tensor]) -> None:
    batch = torch.zeros(PIN_MIN_BYTES // 4)
    for _ in range(3):
        out = batch.to("meta")
        assert out.device.type == "meta" and out.shape == batch.shape
    assert len(pinned_copies) == 1 and pinned_copies[0] is batch


def test_an_in_place_change_makes_a_new_pinned_copy(pinned_copies: list[torch.Tensor]) -> None:
    batch = torch.zeros(PIN_MIN_BYTES // 4)
    batch.to("meta")
    batch.add_(1)  # the pinned copy is stale now
    batch.to("meta")
    batch.to("meta")
    assert len(pinned_copies) == 2


def test_small_pinned_cpu_bound_and_grad_tensors_are_left_alone(pinned_copies: list[torch.Tensor]) -> None:
    torch.zeros(16).to("meta")  # too small to pay for a pinned copy
    torch.zeros(PIN_MIN_BYTES // 4).to(torch.float16)  # no device: a dtype change
    torch.zeros(PIN_MIN_BYTES // 4).to("cpu")
    torch.zeros(PIN_MIN_BYTES // 4, requires_grad=True).to("meta")
    assert pinned_copies == []


def test_the_copy_from_the_pinned_tensor_is_non_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict] = []
    original = torch.Tensor.to

    def recording_to(self, *a, **kw):
        seen.append(dict(kw))
        return original(self, *a, **kw)

    monkeypatch.setattr(torch.Tensor, "to", recording_to)
    knobs = Knobs.parse(["pin_host=true"])
    knobs._patch_pin_host(pin=lambda t: t.clone())
    try:
        torch.zeros(PIN_MIN_BYTES // 4).to("meta")
        torch.zeros(16).to("meta")
    finally:
        knobs.remove()
    assert seen == [{"non_blocking": True}, {}]


def _check(t: torch.Tensor) -> bool:
    return bool(t.all())  # the site the tests name: this line


SITE = f"test_knobs.py:{_check.__code__.co_firstlineno + 1}"


def test_an_unsynced_site_answers_its_first_answer_from_then_on() -> None:
    knobs = Knobs.parse([f"unsync={SITE}"])
    assert not torch.Tensor.__dict__.get("__bool__")  # nothing patched before install
    knobs._patch_sync_sites(parse_sites(knobs.values["unsync"]), on_device=lambda t: True)
    try:
        assert _check(torch.ones(3)) is True
        assert _check(torch.zeros(3)) is True  # the program's meaning changed: measurement only
        assert bool(torch.zeros(3).all()) is False  # another line syncs as before
    finally:
        knobs.remove()
    assert _check(torch.zeros(3)) is False


def test_item_tolist_and_nonzero_at_a_named_site_stop_reading_the_device() -> None:
    def read(t: torch.Tensor) -> tuple:
        return t.sum().item(), t.tolist(), t.nonzero().shape[0]

    line = read.__code__.co_firstlineno + 1
    knobs = Knobs()
    knobs._patch_sync_sites(parse_sites(f"x/test_knobs.py:{line}"), on_device=lambda t: True)
    try:
        first = read(torch.tensor([1.0, 0.0]))
        assert read(torch.tensor([5.0, 5.0])) == first == (1.0, [1.0, 0.0], 1)
    finally:
        knobs.remove()
    assert read(torch.tensor([5.0, 5.0])) == (10.0, [5.0, 5.0], 2)


def test_cpu_tensors_never_block_so_the_real_knob_leaves_them_alone() -> None:
    knobs = Knobs()
    knobs._patch_sync_sites(parse_sites(SITE))
    try:
        assert _check(torch.ones(3)) is True
        assert _check(torch.zeros(3)) is False
    finally:
        knobs.remove()


@pytest.mark.parametrize("bad", ["train.py", "train.py:x", ":12", "a.py:1+b.py"])
def test_a_malformed_site_is_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError):
        Knobs.parse([f"unsync={bad}"])


def test_sites_name_a_file_by_its_base_name() -> None:
    assert parse_sites("src/train.py:40+model.py:12") == {("train.py", 40), ("model.py", 12)}
