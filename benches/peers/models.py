"""The main job's models in PyTorch, shared by the peers (`torch_cpu_step.py`, `torch_gpu_step.py`).

typed-amp's definitions are in `cli/src/models.rs`:

- `mlp()`: MLP 784-512-512-10 with ReLU (the CPU step bench's MLP);
- `cnn()`: conv(1->16, 3x3, pad 1)-BN-ReLU-maxpool 2, conv(16->32, 3x3, pad 1)-BN-ReLU-maxpool 2,
  flatten, linear 1568->10, on 1x28x28 images;
- `vit()`: 28x28 images as 16 patches of 7x7, linear 49->64, a class token and learned position
  embedding, 4 pre-norm `nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, dropout=0,
  activation="gelu")`, layer norm and linear 64->10 on the class token; input (batch, 784).

Importing this module has no side effects (it sets no environment variable and touches no device),
so the GPU peer can use it as well as the CPU one.
"""

import torch
import torch.nn as nn


def mlp():
    return nn.Sequential(
        nn.Linear(784, 512),
        nn.ReLU(),
        nn.Linear(512, 512),
        nn.ReLU(),
        nn.Linear(512, 10),
    )


class Vit(nn.Module):
    """The main job's ViT (typed-amp's `cli/src/models.rs`), pre-norm, exact GELU."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(49, 64)
        self.cls = nn.Parameter(torch.randn(1, 1, 64) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, 16, 64) * 0.02)
        layer = nn.TransformerEncoderLayer(
            64, 4, dim_feedforward=128, dropout=0.0, activation="gelu",
            batch_first=True, norm_first=True,
        )
        self.blocks = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        b = x.shape[0]
        # (batch, 784) -> 16 patches of 7x7, row-major, as typed-amp's `Patches<16, 49>`.
        x = x.view(b, 4, 7, 4, 7).permute(0, 1, 3, 2, 4).reshape(b, 16, 49)
        x = self.embed(x) + self.pos
        x = torch.cat([self.cls.expand(b, -1, -1), x], dim=1)
        x = self.blocks(x)
        return self.head(self.norm(x[:, 0]))


def vit():
    return Vit()


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 10),
    )
