"""Procedural, class-conditioned JPEG images that cost what ImageNet-like JPEGs cost to decode.

The case study measures how much of a training step is spent decoding and resizing JPEGs, so
the stand-in images must have natural-image entropy (about 20-40 KB at 224x224, quality 90),
not flat colours that decode for free. Each image layers a two-colour gradient, random shapes,
multi-octave ("1/f") noise, a sinusoidal grating and sensor-like grain. The gradient colours,
the grating's orientation and frequency and the noise roughness depend on the class, so the
classes are separable (in luminance too, for the grayscale MLP) and a model can learn above
chance.

Everything is a pure function of ``(seed, split, class_idx, index, size, quality)``: numpy's
PCG64 generator is seeded from those integers, so the same arguments give the same bytes in
any process, which makes the dataset generator deterministic, parallel and resumable.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw

# Distinct first words for the seed sequences: class styles must not depend on the split,
# and train/val images of the same (class, index) must differ.
_CLASS_STREAM = 0
SPLIT_STREAMS = {"train": 1, "val": 2}

# Synthetic class folders look like ImageNet wnids ("n01443537"); the leading 9 marks them
# as synthetic, and the fixed width keeps sorted(folder names) == class index order.
_WNID_BASE = 90_000_000

# ImageNet-like files are saved at quality ~90; with 4:2:0 chroma that sets the decode work.
DEFAULT_QUALITY = 90

# Amplitudes in 8-bit grey levels, tuned so that 224x224 images at quality 90 average
# about 24 KB (see workloads/README.md for the measurement).
_NOISE_AMPLITUDE = 40.0
_CHROMA_AMPLITUDE = 15.0
_GRATING_AMPLITUDE = 20.0
_DETAIL_AMPLITUDE = 30.0
_GRAIN_SIGMA = 4.0


def class_names(n_classes: int) -> list[str]:
    """Folder names for ``n_classes`` synthetic classes, sorted in class-index order."""
    return [f"n{_WNID_BASE + i:08d}" for i in range(n_classes)]


def _upsampled_noise(rng: np.random.Generator, grid: int, size: int) -> np.ndarray:
    """A ``grid x grid`` Gaussian field bicubically upsampled to ``size x size``."""
    field = rng.standard_normal((grid, grid)).astype(np.float32)
    if grid >= size:
        return field[:size, :size]
    return np.asarray(Image.fromarray(field).resize((size, size), Image.Resampling.BICUBIC))


def _fractal_noise(rng: np.random.Generator, size: int, roughness: float) -> np.ndarray:
    """Unit-variance multi-octave noise; lower ``roughness`` keeps more fine detail."""
    out = np.zeros((size, size), np.float32)
    total_power = 0.0
    grid, octave = 4, 0
    while True:
        amplitude = 2.0 ** (-octave * roughness / 2.0)
        out += amplitude * _upsampled_noise(rng, min(grid, size), size)
        total_power += amplitude * amplitude
        if grid >= size:
            return out / np.sqrt(total_power)
        grid, octave = grid * 2, octave + 1


class _ClassStyle:
    """The per-class statistics that make classes separable: colours, grating, roughness."""

    def __init__(self, seed: int, class_idx: int) -> None:
        rng = np.random.default_rng([seed, _CLASS_STREAM, class_idx])
        self.colour_a = rng.uniform(0.0, 255.0, 3).astype(np.float32)
        self.colour_b = rng.uniform(0.0, 255.0, 3).astype(np.float32)
        self.orientation = float(rng.uniform(0.0, np.pi))
        self.frequency = float(rng.uniform(3.0, 14.0))  # grating cycles per image side
        self.roughness = float(rng.uniform(0.6, 1.2))


def _gradient(style: _ClassStyle, rng: np.random.Generator, yy: np.ndarray, xx: np.ndarray) -> np.ndarray:
    """Linear blend of the class colours along a jittered class direction, as RGB float."""
    angle = style.orientation + rng.normal(0.0, 0.3)
    ramp = xx * np.cos(angle) + yy * np.sin(angle)
    ramp = (ramp - ramp.min()) / max(float(ramp.max() - ramp.min()), 1e-6)
    return style.colour_a * (1.0 - ramp[..., None]) + style.colour_b * ramp[..., None]


def _draw_shapes(image: Image.Image, style: _ClassStyle, rng: np.random.Generator) -> None:
    """Ellipses, rectangles and strokes in jittered class colours: edges that JPEG must code."""
    size = image.width
    scale = size / 224.0
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(20, 40))):
        x0, y0 = rng.uniform(-20 * scale, size, 2)
        w, h = rng.uniform(4 * scale, 60 * scale, 2)
        base = style.colour_a if rng.random() < 0.5 else style.colour_b
        colour = tuple(int(v) for v in np.clip(base + rng.normal(0.0, 40.0, 3), 0, 255))
        kind = rng.random()
        if kind < 0.4:
            draw.ellipse([x0, y0, x0 + w, y0 + h], fill=colour)
        elif kind < 0.7:
            draw.rectangle([x0, y0, x0 + w, y0 + h], fill=colour)
        else:
            direction = 1.0 if rng.random() < 0.5 else -1.0
            width = max(1, int(rng.integers(1, 4) * scale))
            draw.line([x0, y0, x0 + 2 * direction * w, y0 + 2 * h], fill=colour, width=width)


def _texture(style: _ClassStyle, rng: np.random.Generator, yy: np.ndarray, xx: np.ndarray) -> np.ndarray:
    """Additive RGB texture: luminance noise, class grating, local detail, chroma and grain."""
    size = yy.shape[0]
    luminance = _NOISE_AMPLITUDE * _fractal_noise(rng, size, style.roughness)
    phase = rng.uniform(0.0, 2.0 * np.pi)
    luminance += _GRATING_AMPLITUDE * np.sin(
        2.0 * np.pi * style.frequency * (xx * np.cos(style.orientation) + yy * np.sin(style.orientation)) + phase
    )
    # Fine detail in some regions only, as in photos (textured foreground, smooth sky).
    region = np.clip(0.5 * _upsampled_noise(rng, 4, size) + 0.5, 0.0, 1.0)
    luminance += _DETAIL_AMPLITUDE * region * _upsampled_noise(rng, max(size // 2, 1), size)
    red_green = _fractal_noise(rng, size, style.roughness)[..., None] * np.array([1.0, -0.5, -0.5], np.float32)
    blue_yellow = _fractal_noise(rng, size, style.roughness)[..., None] * np.array([0.0, 0.7, -0.7], np.float32)
    grain = rng.normal(0.0, _GRAIN_SIGMA, (size, size, 1)).astype(np.float32)
    return luminance[..., None] + _CHROMA_AMPLITUDE * (red_green + blue_yellow) + grain


def render_image(seed: int, split: str, class_idx: int, index: int, size: int) -> Image.Image:
    """The RGB image number ``index`` of class ``class_idx`` in ``split``, ``size`` pixels square."""
    style = _ClassStyle(seed, class_idx)
    rng = np.random.default_rng([seed, SPLIT_STREAMS[split], class_idx, index])
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    canvas = Image.fromarray(np.clip(_gradient(style, rng, yy, xx), 0, 255).astype(np.uint8))
    _draw_shapes(canvas, style, rng)
    pixels = np.asarray(canvas, dtype=np.float32) + _texture(style, rng, yy, xx)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def render_jpeg(seed: int, split: str, class_idx: int, index: int, size: int, quality: int) -> bytes:
    """``render_image`` encoded as baseline JPEG (4:2:0, like most ImageNet files)."""
    buffer = io.BytesIO()
    render_image(seed, split, class_idx, index, size).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()
