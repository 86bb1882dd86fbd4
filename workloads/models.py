"""The case study's two models, randomly initialised (nothing is ever downloaded).

* ``custom``: the book's dense MLP on flattened grayscale images. With the default hidden
  sizes 8192..64 at 224x224 its first layer alone is 50176 x 8192, so the model is
  weight-heavy and cheap per image: the data pipeline, not the GPU, sets its pace.
* ``vit``: ViT-H/14 (hidden 1280, 32 layers, 16 heads, MLP 5120, patch 14) from a
  ``transformers`` ``ViTConfig``: compute-heavy, the opposite regime.

The ``*_parameter_count`` functions compute the counts from the architecture alone, so the
full-size numbers can be checked without allocating 2.5 GB of weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import ViTConfig

DEFAULT_MLP_DIMS = (8192, 4096, 2048, 1024, 512, 256, 128, 64)

VIT_H14 = {
    "hidden_size": 1280,
    "num_hidden_layers": 32,
    "num_attention_heads": 16,
    "intermediate_size": 5120,
    "patch_size": 14,
}


def build_custom_mlp(resolution: int, n_classes: int, hidden_dims: Sequence[int] = DEFAULT_MLP_DIMS) -> nn.Sequential:
    """Flatten, then Linear+ReLU per hidden size, then a Linear to ``n_classes`` logits."""
    widths = [resolution * resolution, *hidden_dims]
    layers: list[nn.Module] = [nn.Flatten()]
    for width_in, width_out in pairwise(widths):
        layers += [nn.Linear(width_in, width_out), nn.ReLU()]
    layers.append(nn.Linear(widths[-1], n_classes))
    return nn.Sequential(*layers)


def mlp_parameter_count(resolution: int, n_classes: int, hidden_dims: Sequence[int] = DEFAULT_MLP_DIMS) -> int:
    """Weights plus biases of ``build_custom_mlp(resolution, n_classes, hidden_dims)``."""
    widths = [resolution * resolution, *hidden_dims, n_classes]
    return sum(width_in * width_out + width_out for width_in, width_out in pairwise(widths))


def vit_config(resolution: int, n_classes: int, **overrides: Any) -> ViTConfig:
    """ViT-H/14 for ``resolution``-pixel RGB images; ``overrides`` shrink it for tests."""
    from transformers import ViTConfig  # deferred: the MLP path should not pay for the import

    return ViTConfig(image_size=resolution, num_channels=3, num_labels=n_classes, **{**VIT_H14, **overrides})


class ViTClassifier(nn.Module):
    """``ViTForImageClassification`` returning bare logits, like the MLP.

    One output type keeps the training loop, DDP and ``torch.compile`` identical for both
    models (no ``ModelOutput`` dataclass in the compiled graph).
    """

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        from transformers import ViTForImageClassification

        self.vit = ViTForImageClassification(config)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.vit(pixel_values=pixel_values).logits


def vit_parameter_count(config: ViTConfig) -> int:
    """Parameters of ``ViTForImageClassification(config)`` (no pooler, no mask token)."""
    hidden, mlp = config.hidden_size, config.intermediate_size
    patches = (config.image_size // config.patch_size) ** 2
    embeddings = (
        hidden  # CLS token
        + (patches + 1) * hidden  # position embeddings
        + config.num_channels * config.patch_size**2 * hidden
        + hidden  # patch projection (a strided convolution) with bias
    )
    query_key_value = 3 * (hidden * hidden + (hidden if config.qkv_bias else 0))
    attention = query_key_value + hidden * hidden + hidden  # the output projection always has a bias
    layer = attention + (hidden * mlp + mlp) + (mlp * hidden + hidden) + 2 * (2 * hidden)  # + 2 LayerNorms
    classifier = hidden * config.num_labels + config.num_labels
    return embeddings + config.num_hidden_layers * layer + 2 * hidden + classifier


def count_parameters(model: nn.Module) -> int:
    """Number of parameters, counting shared tensors once."""
    return sum(parameter.numel() for parameter in {id(p): p for p in model.parameters()}.values())
