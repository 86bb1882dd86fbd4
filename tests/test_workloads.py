"""Tests for the reference workloads (workloads/): models, dataset generator, reader, train.py.

Everything runs on CPU in well under a minute: the full-size models are only counted (from
their architecture, and on the ``meta`` device), while small ones are built for real.
"""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
import time
import types
from itertools import pairwise
from pathlib import Path

import pytest
import torch
from PIL import Image

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from workloads import data as workloads_data  # noqa: E402
from workloads import make_dataset  # noqa: E402
from workloads import train as train_script  # noqa: E402
from workloads.data import (  # noqa: E402
    IMG_EXTENSIONS,
    GrayscaleCollator,
    ImageFolderDataset,
    RGBCollator,
    SyntheticJPEGDataset,
    image_folder,
)
from workloads.imagegen import class_names  # noqa: E402
from workloads.models import (  # noqa: E402
    DEFAULT_MLP_DIMS,
    ViTClassifier,
    build_custom_mlp,
    count_parameters,
    mlp_parameter_count,
    vit_config,
    vit_parameter_count,
)

TRAIN_PY = REPO_ROOT / "workloads" / "train.py"
SMOKE = make_dataset.PRESETS["smoke"]
TINY_MLP = ["--model_name", "custom", "--resolution", "16", "--intermidiate_dimensions", "32", "--batch_size", "16"]


def linear_layers(widths: list[int]) -> int:
    """Weights + biases of a chain of nn.Linear layers through ``widths``."""
    return sum(a * b + b for a, b in pairwise(widths))


def run_train(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """train.py in a fresh interpreter, as a user would run it."""
    return subprocess.run(
        [sys.executable, str(TRAIN_PY), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT
    )


def log_messages(stdout: str) -> list[str]:
    """The messages of the book-style log lines ``[date] INFO - message``."""
    return [line.split(" INFO - ", 1)[1] for line in stdout.splitlines() if " INFO - " in line]


def one(messages: list[str], prefix: str) -> str:
    """The single log message starting with ``prefix``."""
    found = [message for message in messages if message.startswith(prefix)]
    assert len(found) == 1, (prefix, messages)
    return found[0]


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The smoke preset, generated once for the module with two worker processes."""
    out = tmp_path_factory.mktemp("smoke")
    assert make_dataset.main(["--preset", "smoke", "--out", str(out), "--workers", "2"]) == 0
    return out


def relative_files(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


# --- models ---------------------------------------------------------------------------


def test_custom_mlp_full_size_count_is_the_books_400m_class() -> None:
    expected = linear_layers([224 * 224, 8192, 4096, 2048, 1024, 512, 256, 128, 64, 200])
    assert DEFAULT_MLP_DIMS == (8192, 4096, 2048, 1024, 512, 256, 128, 64)
    assert mlp_parameter_count(224, 200) == expected == 455_807_624
    with torch.device("meta"):
        model = build_custom_mlp(224, 200)
    assert count_parameters(model) == expected
    assert model[1].in_features == 50176 and model[1].out_features == 8192


def test_custom_mlp_small_is_exact_and_runs() -> None:
    model = build_custom_mlp(16, 5, [32, 8])
    assert count_parameters(model) == linear_layers([256, 32, 8, 5]) == mlp_parameter_count(16, 5, [32, 8])
    kinds = [type(module).__name__ for module in model]
    assert kinds == ["Flatten", "Linear", "ReLU", "Linear", "ReLU", "Linear"]
    assert model(torch.rand(3, 1, 16, 16)).shape == (3, 5)


def test_vit_h14_full_size_count() -> None:
    config = vit_config(224, 200)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (1280, 32, 16)
    assert (config.intermediate_size, config.patch_size, config.image_size) == (5120, 14, 224)
    hidden, mlp, patches = 1280, 5120, (224 // 14) ** 2
    embeddings = hidden + (patches + 1) * hidden + 3 * 14 * 14 * hidden + hidden
    block = 4 * (hidden * hidden + hidden) + linear_layers([hidden, mlp, hidden]) + 4 * hidden
    expected = embeddings + 32 * block + 2 * hidden + hidden * 200 + 200
    assert vit_parameter_count(config) == expected == 631_021_000
    with torch.device("meta"):
        model = ViTClassifier(config)
    assert count_parameters(model) == expected


def test_small_vit_is_exact_and_trains_on_rgb_batches(smoke_dir: Path) -> None:
    config = vit_config(
        28, SMOKE.classes, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    model = ViTClassifier(config)
    assert count_parameters(model) == vit_parameter_count(config)
    dataset = image_folder(smoke_dir / "train")
    inputs, labels = RGBCollator(28)([dataset[i] for i in range(4)])
    loss = torch.nn.functional.cross_entropy(model(inputs), labels)
    loss.backward()
    assert model(inputs).shape == (4, SMOKE.classes) and torch.isfinite(loss)


# --- dataset generator and reader -------------------------------------------------------


def test_smoke_dataset_layout_and_jpegs(smoke_dir: Path) -> None:
    names = class_names(SMOKE.classes)
    for split, count in (("train", SMOKE.per_class), ("val", SMOKE.val_per_class)):
        assert sorted(p.name for p in (smoke_dir / split).iterdir()) == names
        for name in names:
            files = sorted((smoke_dir / split / name).iterdir())
            assert [f.name for f in files] == [f"{name}_{i:05d}.JPEG" for i in range(count)]
    sizes = []
    for path in smoke_dir.rglob("*.JPEG"):
        with Image.open(path) as image:
            assert (image.format, image.mode, image.size) == ("JPEG", "RGB", (224, 224))
            image.load()
        sizes.append(path.stat().st_size)
    assert 15_000 < sum(sizes) / len(sizes) < 45_000  # textured, ImageNet-like entropy
    assert not [p for p in smoke_dir.rglob("*") if p.name.endswith(".tmp")]


def test_folder_reader_reads_the_smoke_dataset(smoke_dir: Path) -> None:
    own = ImageFolderDataset(smoke_dir / "train")
    assert own.classes == class_names(SMOKE.classes)
    assert len(own) == SMOKE.classes * SMOKE.per_class
    assert own.targets == sorted(own.targets)
    image, target = own[SMOKE.per_class]  # first image of the second class
    assert target == 1 and image.size == (224, 224)
    chosen = image_folder(smoke_dir / "train")  # torchvision's DatasetFolder when it imports
    assert chosen.classes == own.classes and chosen.samples == own.samples
    inputs, labels = GrayscaleCollator(32)([own[i] for i in range(5)])
    assert inputs.shape == (5, 1, 32, 32) and inputs.dtype == torch.float32
    assert 0.0 <= float(inputs.min()) < float(inputs.max()) <= 1.0
    assert labels.tolist() == own.targets[:5]


def test_folder_reader_follows_datasetfolder_conventions(tmp_path: Path) -> None:
    for class_name, files in {"zebra": ["b.JPEG", "a.png", "notes.txt"], "ant": ["x.jpg", ".x.JPEG.tmp"]}.items():
        (tmp_path / class_name).mkdir()
        for file_name in files:
            Image.new("RGB", (4, 4)).save(tmp_path / class_name / file_name, format="PNG")
    (tmp_path / "stray.jpg").write_bytes(b"")  # files at the top level are not samples
    dataset = ImageFolderDataset(tmp_path)
    assert dataset.classes == ["ant", "zebra"] and dataset.class_to_idx == {"ant": 0, "zebra": 1}
    assert [(Path(p).name, t) for p, t in dataset.samples] == [("x.jpg", 0), ("a.png", 1), ("b.JPEG", 1)]
    assert ".jpeg" in IMG_EXTENSIONS


def test_a_broken_torchvision_falls_back_to_the_own_reader(smoke_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class BrokenTorchvision(types.ModuleType):
        def __getattr__(self, name: str) -> object:
            raise RuntimeError("operator torchvision::nms does not exist")  # torch/torchvision mismatch

    monkeypatch.setitem(sys.modules, "torchvision", BrokenTorchvision("torchvision"))
    monkeypatch.setitem(sys.modules, "torchvision.datasets", BrokenTorchvision("torchvision.datasets"))
    dataset = image_folder(smoke_dir / "val")
    assert isinstance(dataset, ImageFolderDataset) and len(dataset) == SMOKE.classes * SMOKE.val_per_class


def test_generation_is_deterministic_and_subsets_match(smoke_dir: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    assert make_dataset.main(["--preset", "smoke", "--out", str(again), "--workers", "1"]) == 0
    assert relative_files(again) == relative_files(smoke_dir)
    subset = tmp_path / "subset"
    make_dataset.main(
        [
            "--preset",
            "smoke",
            "--out",
            str(subset),
            "--classes",
            "2",
            "--per_class",
            "3",
            "--val_per_class",
            "1",
            "--workers",
            "2",
        ]
    )
    full = relative_files(smoke_dir)
    subset_files = relative_files(subset)
    assert len(subset_files) == 2 * (3 + 1)
    assert all(full[name] == data for name, data in subset_files.items())


def test_generation_resumes_by_rewriting_only_missing_files(
    smoke_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(smoke_dir, copy)
    before = {path: path.stat().st_mtime_ns for path in copy.rglob("*.JPEG")}
    victim = copy / "train" / class_names(1)[0] / f"{class_names(1)[0]}_00003.JPEG"
    original = victim.read_bytes()
    victim.unlink()
    (victim.parent / f".{victim.name}.tmp").write_bytes(original[:100])  # an interrupted write
    capsys.readouterr()
    make_dataset.main(["--preset", "smoke", "--out", str(copy), "--workers", "2"])
    assert "wrote 1, skipped 39 already present" in capsys.readouterr().out
    assert victim.read_bytes() == original
    changed = [path for path, mtime in before.items() if path.stat().st_mtime_ns != mtime]
    assert changed == [victim]
    assert not [p for p in copy.rglob("*") if p.name.endswith(".tmp")]


def test_synthetic_dataset_is_deterministic_jpeg_bytes() -> None:
    first = SyntheticJPEGDataset(12, 3, 32, seed=5, split="train")
    second = SyntheticJPEGDataset(12, 3, 32, seed=5, split="train")
    assert first.images == second.images and first.targets == [i % 3 for i in range(12)]
    image, label = first[4]
    assert image.format == "JPEG" and image.size == (32, 32) and label == 1


def test_a_large_synthetic_set_repeats_a_pool_of_images_and_its_labels_still_cycle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workloads_data, "UNIQUE_IMAGES", 8)  # 8 -> 6: a multiple of the 3 classes
    large = SyntheticJPEGDataset(20, 3, 16, seed=5, split="train")
    assert len(large) == 20 and len(large.images) == 6 and len(set(large.images)) == 6
    small = SyntheticJPEGDataset(6, 3, 16, seed=5, split="train")
    assert large.images == small.images  # the same first images, whatever the set's size
    for index in range(20):
        image, label = large[index]
        assert label == index % 3 and image.tobytes() == small[index % 6][0].tobytes()
    with pytest.raises(IndexError):
        large[20]


# --- train.py -----------------------------------------------------------------------------


@pytest.mark.slow
def test_train_synthetic_logs_the_books_lines() -> None:
    result = run_train(
        *TINY_MLP,
        "--dataset",
        "synthetic",
        "--num_epochs",
        "2",
        "--synthetic_samples",
        "64",
        "--epochs_eval",
        "1",
        "--iteration_logging",
    )
    assert result.returncode == 0, result.stderr
    messages = log_messages(result.stdout)
    assert messages[1] == "############# Config #############"
    assert "### model_name: custom" in messages and "### Device: cpu" in messages
    assert "### AMP Enabled: False" in messages
    expected = mlp_parameter_count(16, train_script.SYNTHETIC_CLASSES, [32])
    assert one(messages, "### Total number of parameters: ").endswith(f"({expected})")
    assert "### Total training samples (batches): 64 (4)" in messages
    assert "### Total validation samples (batches): 16 (1)" in messages
    assert len([m for m in messages if "] [STEP: " in m and "Loss: " in m]) == 8
    for epoch in (1, 2):
        words = one(messages, f"[EPOCH: {epoch}] Training throughput: ").split()
        assert float(words[4]) > 0 and words[5] == "img/s"
        assert one(messages, f"[EPOCH: {epoch}] Accuracy: ")
    assert one(messages, "Complete training time: ")
    assert float(one(messages, "Training throughput excluding first epoch: ").split()[-2]) > 0
    assert one(messages, "GPU memory reserved: ") == "GPU memory reserved: n/a (device is cpu)"


@pytest.mark.slow
def test_train_on_the_smoke_folder_with_workers_bf16_and_max_steps(smoke_dir: Path) -> None:
    result = run_train(
        *TINY_MLP,
        "--dataset",
        str(smoke_dir),
        "--num_epochs",
        "3",
        "--num_workers",
        "2",
        "--mixed_precision",
        "bf16",
        "--max_steps",
        "2",
        "--batch_size",
        "8",
    )
    assert result.returncode == 0, result.stderr
    messages = log_messages(result.stdout)
    assert "### AMP Enabled: True" in messages and "### Number of classes: 4" in messages
    assert "### Total training samples (batches): 32 (4)" in messages
    assert "(16 images in " in one(messages, "[EPOCH: 1] Training throughput: ")
    assert one(messages, "[EPOCH: 1] Accuracy: ")
    assert "Stopping after --max_steps 2 optimizer steps" in messages
    assert "n/a (only one epoch ran)" in one(messages, "Training throughput excluding first epoch: ")


@pytest.mark.slow
def test_train_under_torchrun_shards_and_logs_once() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(TRAIN_PY),
            *TINY_MLP,
            "--dataset",
            "synthetic",
            "--num_epochs",
            "1",
            "--synthetic_samples",
            "64",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr
    messages = log_messages(result.stdout)
    assert "### World size: 2" in messages
    assert "### Total training samples (batches) per process: 32 (2)" in messages
    assert one(messages, "[EPOCH: 1] Training throughput: ").endswith("on rank 0)")
    assert one(messages, "Complete training time: ")


def test_a_summed_tensor_is_held_until_the_process_group_lets_it_go() -> None:
    """The SIGABRT at exit under torchrun (gloo's thread freeing a collective's tensor after the
    interpreter began to shut down) is a race; what prevents it is that ``released_by_backend``
    returns only once no other holder of the tensor is left, and gives up after its timeout."""
    tensor = torch.ones(3)
    train_script.released_by_backend(tensor, timeout_s=5.0)  # only Python holds it: at once
    assert tensor._use_count() == 1
    view = tensor.view(3)  # a second holder that never goes away
    started = time.monotonic()
    train_script.released_by_backend(tensor, timeout_s=0.2)
    assert 0.2 <= time.monotonic() - started < 2.0
    assert tensor._use_count() > 1 and view is not None


def test_pretrained_is_rejected_with_exit_code_2() -> None:
    result = run_train("--model_name", "vit", "--dataset", "synthetic", "--pretrained")
    assert result.returncode == 2
    assert "--pretrained is not supported" in result.stderr and "never download" in result.stderr


def test_missing_dataset_folder_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        train_script.parse_args(["--model_name", "custom", "--dataset", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "train" in capsys.readouterr().err


def test_cuda_out_of_memory_prints_one_line_and_exits_3(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def out_of_memory(*_: object) -> None:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(train_script, "train", out_of_memory)
    with pytest.raises(SystemExit) as exit_info:
        train_script.main([*TINY_MLP, "--dataset", "synthetic", "--batch_size", "512"])
    assert exit_info.value.code == train_script.OOM_EXIT_CODE == 3
    assert capsys.readouterr().out == "CUDA out of memory at batch size 512\n"


@pytest.mark.slow
def test_runpy_runs_twice_in_one_process(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [str(TRAIN_PY), *TINY_MLP, "--dataset", "synthetic", "--num_epochs", "1", "--synthetic_samples", "32"]
    for _ in range(2):
        monkeypatch.setattr(sys, "argv", argv)
        runpy.run_path(str(TRAIN_PY), run_name="__main__")
        messages = log_messages(capsys.readouterr().out)
        assert one(messages, "[EPOCH: 1] Accuracy: ") and one(messages, "Complete training time: ")
