"""Generated data for the outside corpus: every file a script would otherwise download.

Contract: ``prepare(step, src) -> str`` writes what one manifest ``prepare`` step asks for (its
``kind`` picks a generator below, ``dest`` names where, ``{src}`` standing for the repository's
fetched folder) and returns a one-line description. Generators are seeded, so a step gives the
same files on every machine, and idempotent: a step whose marker is there is not redone. Only
generated data: no generator reads the network, and none copies a real data set. The content
is noise with some structure (smooth images, Zipf-distributed words): what a data loader, a
decoder and a model cost does not depend on what the pixels mean.

    python benchmarks/zoo/prepare.py --scripts DIR [--only NAME ...]   # what fetch.py runs
"""

from __future__ import annotations

import hashlib
import json
import pickle
import struct
from pathlib import Path

import numpy as np

SEED = 32  # issue 32


def _marker(step: dict, dest: Path) -> Path:
    key = hashlib.sha256(json.dumps(step, sort_keys=True).encode()).hexdigest()[:16]
    return dest / f".zoo-prepared-{key}"


def prepare(step: dict, src: Path) -> str:
    """Run one ``prepare`` step of the manifest for the repository fetched at ``src``."""
    dest = Path(str(step["dest"]).replace("{src}", str(src)))
    dest.mkdir(parents=True, exist_ok=True)
    marker = _marker(step, dest)
    if marker.exists():
        return f"{step['kind']}: {dest} (already there)"
    what = GENERATORS[step["kind"]](dest, step)
    marker.write_text(json.dumps(step, sort_keys=True))
    return f"{step['kind']}: {what}"


def mnist(dest: Path, step: dict) -> str:
    """torchvision's MNIST raw files (idx format, uncompressed: torchvision looks for these
    names and downloads only when they are missing); 60,000 and 10,000 images by default."""
    rng = np.random.default_rng(SEED)
    raw = dest / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, count in (("train", int(step.get("train", 60000))), ("t10k", int(step.get("test", 10000)))):
        labels = rng.integers(0, 10, count, dtype=np.uint8)
        # a bright square per image, placed by its label, over faint noise
        images = rng.integers(0, 40, (count, 28, 28), dtype=np.uint8)
        for digit in range(10):
            row, col = 2 + (digit // 5) * 12, 2 + (digit % 5) * 5
            images[labels == digit, row : row + 10, col : col + 4] = 255
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, count, 28, 28) + images.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, count) + labels.tobytes())
    return f"{raw} (MNIST layout, generated)"


def _vocabulary(rng: np.random.Generator, size: int) -> list[str]:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = set()
    while len(words) < size:
        words.add("".join(rng.choice(letters, int(rng.integers(2, 10)))))
    return sorted(words)


def text(dest: Path, step: dict) -> str:
    """Plain text of Zipf-distributed words from a made-up vocabulary, lines of 5-30 words, each
    a sentence (its first word capitalised, a comma now and then, ended by . ! or ?: the
    characters a character-level script samples from); punctuation stands apart as its own
    token. The first file gets ``words`` words, the others a tenth each (validation, test)."""
    rng = np.random.default_rng(SEED)
    vocab = _vocabulary(rng, int(step.get("vocab", 5000)))
    ranks = np.arange(1, len(vocab) + 1)
    p = 1.0 / ranks
    p /= p.sum()
    files = step.get("files", ["train.txt"])
    for i, name in enumerate(files):
        count = int(step.get("words", 200000)) // (1 if i == 0 else 10)
        ids = rng.choice(len(vocab), count, p=p)
        lines, at = [], 0
        while at < count:
            n = int(rng.integers(5, 31))
            words = [vocab[j] for j in ids[at : at + n]]
            words[0] = words[0].capitalize()
            commas = rng.random(len(words)) < 0.08
            body = " ".join(
                w + (" ," if comma and k < len(words) - 1 else "")
                for k, (w, comma) in enumerate(zip(words, commas, strict=True))
            )
            lines.append(f" {body} {'.!?'[int(rng.integers(0, 3))]}")
            at += n
        (dest / name).write_text("\n".join(lines) + "\n")
    return f"{dest} ({', '.join(files)})"


def lines(dest: Path, step: dict) -> str:
    """One made-up lower-case word a line (2-9 letters), ``lines`` of them (32,000 by default)
    in ``file``: what a character-level model of names reads."""
    rng = np.random.default_rng(SEED)
    words = _vocabulary(rng, int(step.get("lines", 32000)))
    order = rng.permutation(len(words))
    path = dest / str(step.get("file", "names.txt"))
    path.write_text("\n".join(words[i] for i in order) + "\n")
    return f"{path} ({len(words)} lines)"


def tokens(dest: Path, step: dict) -> str:
    """nanoGPT's data layout: train.bin and val.bin (uint16 token ids) and meta.pkl."""
    rng = np.random.default_rng(SEED)
    vocab = int(step.get("vocab", 65))
    count = int(step.get("tokens", 1000000))
    rng.integers(0, vocab, count, dtype=np.uint16).tofile(dest / "train.bin")
    rng.integers(0, vocab, max(count // 10, 4096), dtype=np.uint16).tofile(dest / "val.bin")
    chars = [chr(32 + i) for i in range(vocab)]
    meta = {"vocab_size": vocab, "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)}}
    (dest / "meta.pkl").write_bytes(pickle.dumps(meta))
    return f"{dest} ({count} tokens, vocabulary {vocab})"


def _image(rng: np.random.Generator, size: int) -> np.ndarray:
    """A smooth colour gradient with a little noise (JPEGs of a realistic size, not of noise)."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    a, b, c = rng.random(3) * 6
    img = np.stack([np.sin(a * x + b * y), np.cos(b * x - c * y), np.sin(c * (x + y))], axis=-1)
    img = (img + 1) * 110 + rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def images(dest: Path, step: dict) -> str:
    """JPEGs: ``flat`` (img_00000.jpg ...), ``classes`` (an ImageFolder: class_k/img_i.jpg) or
    ``labelled`` (the label in the name, ``label_i.jpg``, as the Oxford pets files are)."""
    from PIL import Image

    rng = np.random.default_rng([SEED, int(hashlib.sha256(str(step["dest"]).encode()).hexdigest()[:8], 16)])
    count, size = int(step.get("count", 256)), int(step.get("size", 64))
    layout, classes = step.get("layout", "flat"), int(step.get("classes", 10))
    for i in range(count):
        label = i % classes
        if layout == "classes":
            path = dest / f"class_{label}" / f"img_{i:05d}.jpg"
        elif layout == "labelled":
            path = dest / f"breed{label}_{i}.jpg"
        else:
            path = dest / f"img_{i:05d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(_image(rng, size)).save(path, quality=90)
    return f"{dest} ({count} JPEGs of {size}x{size}, {layout})"


def cifar_pt(dest: Path, step: dict) -> str:
    """The tensors airbench caches CIFAR-10 into (train.pt, test.pt): uint8 NHWC images, labels."""
    import torch

    rng = np.random.default_rng(SEED)
    classes = [f"class{k}" for k in range(10)]
    for name, count in (("train.pt", int(step.get("train", 50000))), ("test.pt", int(step.get("test", 10000)))):
        labels = rng.integers(0, 10, count)
        images = rng.integers(0, 256, (count, 32, 32, 3), dtype=np.uint8)
        torch.save(
            {"images": torch.from_numpy(images), "labels": torch.from_numpy(labels), "classes": classes}, dest / name
        )
    return f"{dest} (train.pt, test.pt)"


def timm_hub_weights(dest: Path, step: dict) -> str:
    """Randomly initialised weights of a timm model, written where the Hugging Face hub cache
    (``HF_HOME=dest``) keeps that model's pretrained ones: ``create_model(pretrained=True)``
    then loads them with ``HF_HUB_OFFLINE=1``, and nothing is downloaded. Needs timm."""
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(SEED)
    model = timm.create_model(step["model"], pretrained=False)
    cfg = model.pretrained_cfg
    hub_id = cfg.get("hf_hub_id") or f"timm/{step['model']}"
    repo_id, _, revision = hub_id.partition("@")
    revision = revision or "main"
    filename = cfg.get("hf_hub_filename") or "model.safetensors"
    if not filename.endswith(".safetensors"):
        filename = "model.safetensors"
    folder = dest / "hub" / ("models--" + repo_id.replace("/", "--"))
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / revision).write_text(commit)
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(snapshot / filename))
    return f"{snapshot / filename} (random weights for {repo_id})"


def citation_graph(dest: Path, step: dict) -> str:
    """A citation graph in Cora's text layout, as pygcn reads it: ``{name}.content``, one node a
    line (its id, ``features`` binary word features, its class name, tab-separated), and
    ``{name}.cites`` (``cited citing`` ids, one edge a line, every id a node's). Defaults are
    Cora's sizes: 2,708 nodes, 1,433 features, 7 classes, 5,429 edges. Each class draws its
    words from its own share of the vocabulary more often, and most edges join nodes of one
    class (a graph a GCN can learn from); no edge twice, none from a node to itself."""
    rng = np.random.default_rng(SEED)
    name = str(step.get("name", "cora"))
    nodes, width = int(step.get("nodes", 2708)), int(step.get("features", 1433))
    classes, edges = int(step.get("classes", 7)), int(step.get("edges", 5429))
    ids = np.sort(rng.choice(np.arange(1, 50 * nodes), nodes, replace=False))
    labels = rng.integers(0, classes, nodes)
    p = np.full((classes, width), 0.01)
    for k in range(classes):
        p[k, k * width // classes : (k + 1) * width // classes] = 0.05
    features = (rng.random((nodes, width)) < p[labels]).astype(np.uint8)
    with open(dest / f"{name}.content", "w") as f:
        for i in range(nodes):
            f.write(f"{ids[i]}\t" + "\t".join(map(str, features[i])) + f"\tclass_{labels[i]}\n")
    by_class = [np.flatnonzero(labels == k) for k in range(classes)]
    seen: set[tuple[int, int]] = set()
    while len(seen) < edges:
        a = int(rng.integers(0, nodes))
        b = int(rng.choice(by_class[labels[a]])) if rng.random() < 0.8 else int(rng.integers(0, nodes))
        if a != b and (a, b) not in seen and (b, a) not in seen:
            seen.add((a, b))
    with open(dest / f"{name}.cites", "w") as f:
        f.writelines(f"{ids[a]}\t{ids[b]}\n" for a, b in sorted(seen))
    return f"{dest} ({name}.content, {name}.cites: {nodes} nodes, {edges} edges, {classes} classes)"


def point_clouds(dest: Path, step: dict) -> str:
    """ModelNet40's resampled text layout, as Pointnet_Pointnet2_pytorch reads it:
    ``modelnet40_shape_names.txt`` (one class a line), ``modelnet40_train.txt`` and
    ``modelnet40_test.txt`` (shape ids, ``<class>_<4 digits>``) and one ``<class>/<id>.txt`` a
    shape, ``points`` lines of ``x,y,z,nx,ny,nz``. ``classes`` made-up classes (``shape00``...),
    ``train`` and ``test`` shapes of each. Each class is a noisy ellipsoid of its own axes, its
    normals the unit vectors out of it (a class a model can learn). Real files hold 10,000 points;
    the script reads the first ``--num_point`` (1,024 by default), so ``points`` must be as many."""
    rng = np.random.default_rng(SEED)
    classes, points = int(step.get("classes", 40)), int(step.get("points", 2048))
    per = {"train": int(step.get("train", 18)), "test": int(step.get("test", 4))}
    names = [f"shape{k:02d}" for k in range(classes)]
    (dest / "modelnet40_shape_names.txt").write_text("".join(f"{n}\n" for n in names))
    axes = rng.uniform(0.3, 1.0, (classes, 3))
    ids: dict[str, list[str]] = {"train": [], "test": []}
    for k, name in enumerate(names):
        (dest / name).mkdir(exist_ok=True)
        for i in range(per["train"] + per["test"]):
            shape = f"{name}_{i + 1:04d}"
            ids["train" if i < per["train"] else "test"].append(shape)
            unit = rng.normal(size=(points, 3))
            unit /= np.linalg.norm(unit, axis=1, keepdims=True)
            xyz = unit * axes[k] * rng.uniform(0.9, 1.1) + rng.normal(0, 0.01, (points, 3))
            np.savetxt(dest / name / f"{shape}.txt", np.hstack([xyz, unit]), fmt="%.6f", delimiter=",")
    for split in ("train", "test"):
        (dest / f"modelnet40_{split}.txt").write_text("".join(f"{s}\n" for s in ids[split]))
    total = classes * (per["train"] + per["test"])
    return f"{dest} (ModelNet40 layout: {total} shapes of {points} points, {classes} classes)"


def interactions(dest: Path, step: dict) -> str:
    """User-item interactions as SASRec reads them: ``file``, one ``user item`` pair a line
    (ids from 1), each user's lines together and in the order they happened. ``users`` users
    (6,040 by default, MovieLens-1M's count) over ``items`` items (3,416), each with a history of
    at least 5 interactions (lognormal lengths, about ``mean`` of them), items drawn by a Zipf
    popularity, no item twice in one history."""
    rng = np.random.default_rng(SEED)
    users, items = int(step.get("users", 6040)), int(step.get("items", 3416))
    mean = float(step.get("mean", 165))
    p = 1.0 / np.arange(1, items + 1) ** 0.8
    p /= p.sum()
    order = rng.permutation(items) + 1  # popularity is not the id order
    lengths = np.clip(rng.lognormal(np.log(mean) - 0.5, 1.0, users).astype(int), 5, items // 2)
    path = dest / str(step.get("file", "interactions.txt"))
    with open(path, "w") as f:
        for user, length in enumerate(lengths, 1):
            history = order[rng.choice(items, int(length), replace=False, p=p)]
            f.write("".join(f"{user} {item}\n" for item in history))
    return f"{path} ({users} users, {items} items, {int(lengths.sum())} interactions)"


def jsonl_text(dest: Path, step: dict) -> str:
    """JSON lines, one ``{"text": ...}`` object a line, as MiniMind's pretraining dataset reads
    them: ``lines`` lines (64,000 by default) in ``file``, each ``min_words``-``max_words`` words
    (20-200) of Zipf-distributed made-up words (the ``text`` kind's vocabulary), sentences ended
    by a full stop."""
    rng = np.random.default_rng(SEED)
    vocab = _vocabulary(rng, int(step.get("vocab", 5000)))
    p = 1.0 / np.arange(1, len(vocab) + 1)
    p /= p.sum()
    count = int(step.get("lines", 64000))
    low, high = int(step.get("min_words", 20)), int(step.get("max_words", 200))
    lengths = rng.integers(low, high + 1, count)
    ids = rng.choice(len(vocab), int(lengths.sum()), p=p)
    path = dest / str(step.get("file", "train.jsonl"))
    at = 0
    with open(path, "w", encoding="utf-8") as f:
        for n in lengths:
            words = [vocab[j] for j in ids[at : at + n]]
            at += n
            words[0] = words[0].capitalize()
            f.write(json.dumps({"text": " ".join(words) + "."}) + "\n")
    return f"{path} ({count} lines of {low}-{high} words)"


def voc_segmentation(dest: Path, step: dict) -> str:
    """Pascal VOC 2012's segmentation layout under ``dest`` (a ``VOC2012`` folder):
    ``JPEGImages/<id>.jpg``, ``SegmentationClass/<id>.png`` (a palette PNG of class indices,
    ``classes`` of them counting the background 0, 255 on the objects' borders, as VOC marks
    them) and ``ImageSets/Segmentation/train.txt`` and ``val.txt`` (``train`` and ``val`` ids).
    Each image is ``width`` x ``height`` (VOC's usual 500 x 375): a smooth gradient with a few
    rectangles, each of one class, tinted by it, so that a model can learn the masks."""
    from PIL import Image

    rng = np.random.default_rng(SEED)
    width, height = int(step.get("width", 500)), int(step.get("height", 375))
    classes = int(step.get("classes", 21))
    per = {"train": int(step.get("train", 2000)), "val": int(step.get("val", 200))}
    root = dest / "VOC2012"
    folders = {name: root / name for name in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation")}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    palette = rng.integers(0, 256, (256, 3), dtype=np.uint8)
    palette[0] = 0
    palette[255] = 224
    tints = rng.integers(-60, 61, (classes, 3))
    n = 0
    for split, count in per.items():
        ids = []
        for _ in range(count):
            name = f"2026_{n:06d}"
            n += 1
            ids.append(name)
            image = _image(rng, max(width, height))[:height, :width].astype(np.int16)
            mask = np.zeros((height, width), np.uint8)
            for _ in range(int(rng.integers(1, 5))):
                label = int(rng.integers(1, classes))
                x0, y0 = int(rng.integers(0, width - 40)), int(rng.integers(0, height - 40))
                x1, y1 = x0 + int(rng.integers(30, width // 2)), y0 + int(rng.integers(30, height // 2))
                mask[y0:y1, x0:x1] = label
                image[y0:y1, x0:x1] += tints[label]
                mask[y0:y1, max(x0 - 2, 0) : x0 + 2] = mask[y0:y1, max(x1 - 2, 0) : x1 + 2] = 255
                mask[max(y0 - 2, 0) : y0 + 2, x0:x1] = mask[max(y1 - 2, 0) : y1 + 2, x0:x1] = 255
            Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(
                folders["JPEGImages"] / f"{name}.jpg", quality=90
            )
            png = Image.fromarray(mask, mode="P")
            png.putpalette(palette.tobytes())
            png.save(folders["SegmentationClass"] / f"{name}.png")
        (folders["ImageSets/Segmentation"] / f"{split}.txt").write_text("".join(f"{i}\n" for i in ids))
    return f"{root} (VOC layout: {per['train']} training and {per['val']} validation images of {width}x{height}, {classes} classes)"


def folder(dest: Path, step: dict) -> str:
    """An empty folder the script writes into but does not create."""
    return f"{dest} (folder)"


GENERATORS = {
    "mnist": mnist,
    "text": text,
    "tokens": tokens,
    "images": images,
    "lines": lines,
    "cifar-pt": cifar_pt,
    "timm-hub-weights": timm_hub_weights,
    "folder": folder,
    "citation-graph": citation_graph,
    "point-clouds": point_clouds,
    "interactions": interactions,
    "jsonl-text": jsonl_text,
    "voc-segmentation": voc_segmentation,
}


def main() -> None:
    import argparse
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    import corpus

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scripts", type=Path, required=True, help="the folder fetch.py filled")
    p.add_argument("--only", nargs="*", help="script names (default: all)")
    args = p.parse_args()
    for script in corpus.load().scripts:
        if args.only and script.name not in args.only:
            continue
        for step in script.prepare:
            print(f"{script.name}: {prepare(step, args.scripts / script.repo.slug)}", flush=True)


if __name__ == "__main__":
    main()
