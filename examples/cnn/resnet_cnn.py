"""A small ResNet-style CNN classifier: the plug-in module of examples/cnn.

A 3x3 stem, then three stages of residual blocks (two 3x3 convolutions with BatchNorm and
a skip connection; the first block of a stage halves the resolution and doubles the
channels, its skip a strided 1x1 convolution), global average pooling and one linear
layer. With the defaults (``width=16``, one block a stage) it has about 78,000
parameters; the trainer fills ``num_classes`` and ``input_shape`` from the data set.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

__version__ = "1.0"


class ResidualBlock(nn.Module):
    """conv-BN-ReLU-conv-BN plus the input (through a strided 1x1 conv when the shape
    changes), then ReLU."""

    def __init__(self, channels_in: int, channels_out: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels_out)
        self.skip: nn.Module = nn.Identity()
        if stride != 1 or channels_in != channels_out:
            self.skip = nn.Sequential(
                nn.Conv2d(channels_in, channels_out, 1, stride, bias=False),
                nn.BatchNorm2d(channels_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.skip(x))


class ResNetCNN(nn.Module):
    """Stem, three stages of ``blocks`` residual blocks (``width``, 2 x ``width`` and
    4 x ``width`` channels at full, half and quarter resolution), pooling, linear."""

    def __init__(self, input_shape: list[int], num_classes: int, width: int = 16,
                 blocks: int = 1) -> None:
        super().__init__()
        channels = input_shape[0]
        self.stem = nn.Sequential(nn.Conv2d(channels, width, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        layers: list[nn.Module] = []
        widths = [width, 2 * width, 4 * width]
        previous = width
        for stage, channels_out in enumerate(widths):
            for block in range(blocks):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(ResidualBlock(previous, channels_out, stride))
                previous = channels_out
        self.stages = nn.Sequential(*layers)
        self.head = nn.Linear(previous, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.stages(self.stem(x))
        return self.head(features.mean(dim=(2, 3)))
