"""A small GPT-style byte-level language model, as a trainer plug-in (``gpt_model:GPT``).

Token and position embeddings, ``n_layer`` pre-norm transformer blocks (causal
self-attention, then a GELU MLP, each added to the residual stream) and a final layer
norm before the output layer. It maps byte sequences ``(B, T)`` to next-byte scores
``(B, T, vocab_size)``; the trainer's default loss (cross-entropy over the last dimension)
trains it against the shifted sequences of ``stdlib_corpus``, with no loss of its own.

The default size (d_model 128, 6 layers, 4 heads, context 128) has 1.27 M parameters.
The output layer is not tied to the token embedding: every tensor has one name, so the
state travels and loads (``load_state_dict(strict=True)``) as it is.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

__version__ = "1.0"


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which each position sees itself and those before it."""

    def __init__(self, d_model: int, n_head: int, dropout: float) -> None:
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model {d_model} is not a multiple of n_head {n_head}")
        self.n_head = n_head
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        heads = [part.view(batch, length, self.n_head, width // self.n_head).transpose(1, 2)
                 for part in self.qkv(x).split(width, dim=2)]
        mixed = F.scaled_dot_product_attention(
            *heads, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.out(mixed.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, d_model: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attention = CausalSelfAttention(d_model, n_head, dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """Next-token scores for every position of a sequence of token ids (bytes by default)."""

    def __init__(self, vocab_size: int = 256, block_size: int = 128, d_model: int = 128,
                 n_layer: int = 6, n_head: int = 4, dropout: float = 0.0) -> None:
        super().__init__()
        self.block_size = block_size
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(block_size, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head, dropout) for _ in range(n_layer))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.apply(_initialise)
        # Residual branches scaled down with depth, so the stream's variance stays level.
        for block in self.blocks:
            for layer in (block.attention.out, block.mlp[2]):
                nn.init.normal_(layer.weight, std=0.02 / math.sqrt(2 * n_layer))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        if length > self.block_size:
            raise ValueError(f"sequence of {length} tokens, the context is {self.block_size}")
        positions = torch.arange(length, device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _initialise(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


@torch.no_grad()
def sample(model: GPT, prompt: bytes, count: int, temperature: float = 0.8,
           seed: int = 0) -> bytes:
    """``prompt`` followed by ``count`` bytes drawn one at a time from the model."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    start = list(prompt) or [ord("\n")]  # an empty prompt starts after a line break
    tokens = torch.tensor([start], dtype=torch.long)
    for _ in range(count):
        scores = model(tokens[:, -model.block_size:])[:, -1] / temperature
        following = torch.multinomial(F.softmax(scores, dim=-1), 1, generator=generator)
        tokens = torch.cat([tokens, following], dim=1)
    return prompt + bytes(tokens[0, len(start):].tolist())
