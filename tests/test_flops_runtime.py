"""Counting one step's FLOPs and measuring memory owners, on CPU tensors with exact figures."""

from __future__ import annotations

import gc

import torch

from diagnose.runtime.flops import StepCounter, matmul_dims
from diagnose.runtime.memory_probe import MemoryProbe, find_owners, owner_bytes, snapshot_at_oom


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    model(x).sum().backward()
    opt.step()


def test_counts_one_step_by_phase() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    x = torch.randn(32, 64)
    _step(model, opt, x)  # not counted
    counter = StepCounter()
    counter.start(step=7)
    _step(model, opt, x)
    count = counter.stop(samples=32)
    _step(model, opt, x)  # not counted either: the mode is gone
    forward = 2 * 32 * 64 * 128 + 2 * 32 * 128 * 8
    # backward: both weight gradients, and the input gradient of the second layer only
    backward = 2 * 32 * 64 * 128 + 2 * 2 * 32 * 128 * 8
    assert count.by_phase == {"forward": forward, "backward": backward, "optimizer": 0}
    assert count.total == forward + backward and count.step == 7 and count.samples == 32
    assert count.ops["aten.addmm"].calls == 2 and count.ops["aten.mm"].calls == 3
    assert count.ops["aten.relu"].bytes == 2 * 32 * 128 * 4  # read and written once
    assert count.ops["aten.t"].bytes == 0  # a view moves nothing
    assert count.bytes_by_phase["optimizer"] > 0  # Adam's updates move bytes, no matmul FLOPs
    shapes = {(s.op, s.m, s.n, s.k, s.dtype): s.calls for s in count.matmuls}
    assert shapes[("aten.addmm", 32, 128, 64, "float32")] == 1
    assert counter.stop() is count  # a second stop changes nothing
    counter.start(step=9)  # nor does a second start
    assert not counter.active
    counter.close()
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

    assert not _global_optimizer_pre_hooks and not _global_optimizer_post_hooks


def test_stopping_inside_an_optimizer_post_hook() -> None:
    """The runner finds a boundary inside an optimizer post-hook: stopping there must work."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    counter = StepCounter()
    handle = register_optimizer_step_post_hook(lambda *a: counter.stop())
    try:
        counter.start(step=0)
        _step(model, opt, torch.randn(2, 4))
    finally:
        handle.remove()
        counter.close()
    assert counter.result is not None and counter.result.by_phase["backward"] > 0


def test_dtype_is_what_the_kernel_sees_under_autocast() -> None:
    layer = torch.nn.Linear(16, 16)
    counter = StepCounter()
    counter.start(step=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer(torch.randn(4, 16))
    count = counter.stop()
    counter.close()
    assert [s.dtype for s in count.matmuls] == ["bfloat16"]


def test_matmul_dims() -> None:
    a, b = torch.empty(5, 3), torch.empty(3, 7)
    assert matmul_dims("aten.mm", (a, b)) == (5, 7, 3)
    assert matmul_dims("aten.addmm", (torch.empty(7), a, b)) == (5, 7, 3)
    assert matmul_dims("aten.bmm", (torch.empty(2, 5, 3), torch.empty(2, 3, 7))) == (10, 7, 3)
    conv = (torch.empty(8, 3, 32, 32), torch.empty(64, 3, 3, 3))
    assert matmul_dims("aten.convolution", conv) == (8 * 32 * 32, 64, 3)


def test_memory_owners_counted_once_per_storage() -> None:
    model = torch.nn.Linear(100, 10)  # 1,010 float32 parameters
    opt = torch.optim.Adam(model.parameters())
    _step(model, opt, torch.randn(4, 100))
    p, g, o = owner_bytes([model, model], [opt], device_type="cpu")
    assert p == 1010 * 4 and g == 1010 * 4
    assert o == 2 * 1010 * 4 + 2 * 4  # exp_avg, exp_avg_sq, and a scalar step per tensor


def test_memory_probe_reads_the_allocator_at_both_ends() -> None:
    # the probe counts every live module: whatever earlier tests left alive is the baseline
    gc.collect()
    other_params, other_grads, _ = owner_bytes(*find_owners(), device_type="cpu")
    model = torch.nn.Linear(100, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    figures = iter(
        [
            {"allocated": 100, "peak_allocated": 100, "reserved": 200, "peak_reserved": 200, "capacity": 1000},
            {"allocated": 150, "peak_allocated": 700, "reserved": 800, "peak_reserved": 800, "capacity": 1000},
        ]
    )
    resets = []
    probe = MemoryProbe(stats=lambda: next(figures), device_type="cpu", reset_peak=lambda: resets.append(1))
    probe.start()
    _step(model, opt, torch.randn(4, 100))
    split = probe.stop(samples=4)
    assert resets == [1]
    assert (split.allocated_start_bytes, split.allocated_end_bytes, split.peak_allocated_bytes) == (100, 150, 700)
    assert split.gradients_start_bytes == other_grads and split.gradients_bytes == other_grads + 1010 * 4
    assert split.parameters_bytes == other_params + 1010 * 4 and split.samples == 4 and split.when == "step"
    assert probe.stop() is split


def _figures() -> object:
    return iter(
        [
            {"allocated": 100, "peak_allocated": 100, "reserved": 800, "peak_reserved": 800, "capacity": 1000},
            {"allocated": 150, "peak_allocated": 700, "reserved": 800, "peak_reserved": 800, "capacity": 1000},
        ]
    )


def test_memory_probe_reads_the_batch_from_the_model_input_when_no_dataloader_told() -> None:
    # examples/oom.py makes its batch with torch.randn: no DataLoader counts samples, and with
    # no sample count the largest batch that fits could not be estimated
    model = torch.nn.Sequential(torch.nn.Linear(10, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    figures = _figures()
    probe = MemoryProbe(stats=lambda: next(figures), device_type="cpu", reset_peak=lambda: None)
    probe.start()
    torch.nn.ReLU()(torch.randn(3, 5))  # a module with no parameters (an activation, a loss): not the model
    _step(model, opt, torch.randn(24, 10))
    split = probe.stop(samples=None)
    assert split.samples == 24
    model(torch.randn(5, 10))  # the hook is gone after the step
    assert probe.input_batch == 24


def test_memory_probe_prefers_the_dataloader_count() -> None:
    model = torch.nn.Linear(10, 10)
    figures = _figures()
    probe = MemoryProbe(stats=lambda: next(figures), device_type="cpu", reset_peak=lambda: None)
    probe.start()
    model(torch.randn(7, 10))  # one sequence of 7 positions from a batch of 1, say
    assert probe.stop(samples=1).samples == 1


def test_snapshot_at_oom_keeps_the_message() -> None:
    stats = {"allocated": 9, "peak_allocated": 10, "reserved": 12, "peak_reserved": 12, "capacity": 16}
    split = snapshot_at_oom(
        "CUDA out of memory. Tried to allocate 2.00 GiB\nmore", stats=lambda: stats, device_type="cpu"
    )
    assert split.when == "oom" and split.message == "CUDA out of memory. Tried to allocate 2.00 GiB"
    assert split.allocated_end_bytes == 9 and split.capacity_bytes == 16


def test_counts_only_the_device_given() -> None:
    counter = StepCounter(device_type="cuda")
    counter.start(step=0)
    torch.randn(4, 4) @ torch.randn(4, 4)  # CPU work (a DataLoader's collation, say): left out
    count = counter.stop()
    counter.close()
    assert count.total == 0 and count.ops == {}


def test_a_compiled_model_stays_compiled_after_the_counted_step() -> None:
    """The counted step runs a compiled model eagerly, and only that step: dynamo, shown the
    compiled frame under the dispatch mode, used to give the code up for good, so that every
    step after the window (the timed ones) ran eagerly."""
    calls = {"compiled": 0}

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
        def run(*args: torch.Tensor):
            calls["compiled"] += 1
            return gm(*args)

        return run

    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(8, 16)
    for _ in range(2):
        compiled(x).sum().backward()
    assert calls["compiled"] == 2
    counter = StepCounter()
    counter.start(step=3)
    compiled(x).sum().backward()
    count = counter.stop(samples=8)
    counter.close()
    assert calls["compiled"] == 2  # counted eagerly: the operators were seen
    assert count.by_phase["forward"] == 2 * 8 * 16 * 32 + 2 * 8 * 32 * 4
    for _ in range(2):
        compiled(x).sum().backward()
    assert calls["compiled"] == 4  # compiled again after the counted step
    assert torch._dynamo.eval_frame._stance.stance == "default"
    torch._dynamo.reset()


def test_memory_probe_keeps_the_inputs_first_two_dimensions() -> None:
    # a sequence-first input (35 positions of a batch of 20, as an LSTM language model takes it):
    # the leading dimension is not the batch; the runner asks the script's batch option which is
    model = torch.nn.Embedding(100, 8)
    figures = _figures()
    probe = MemoryProbe(stats=lambda: next(figures), device_type="cpu", reset_peak=lambda: None)
    probe.start()
    model(torch.randint(0, 100, (35, 20)))
    assert probe.input_dims == (35, 20) and probe.input_batch == 35
    assert probe.stop(samples=20).samples == 20
