"""The GPT-2-shaped causal language model (pre-norm blocks, fused attention) whose forward computes its own
next-token loss."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tunekit.workloads._common import validate

IGNORE_INDEX = -100
"""Label of positions that carry no loss (padding), as ``F.cross_entropy`` and Hugging Face expect."""


@dataclass
class LMOutput:
    """What `gpt_model`'s forward returns, shaped like a Hugging Face ``CausalLMOutput``.

    Attributes:
        loss: Mean next-token cross-entropy over the positions whose label is not -100 (a scalar), or None
            when no labels were given.
        logits: Next-token logits, ``[batch, length, vocab_size]``.
    """

    loss: torch.Tensor | None
    logits: torch.Tensor


class _CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.proj_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        # is_causal without an explicit mask keeps the flash / memory-efficient kernels eligible.
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(batch, length, width)
        return self.proj_dropout(self.proj(y))


class _Block(nn.Module):
    """A pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = _CausalSelfAttention(width, heads, dropout)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width),
            nn.GELU(approximate="tanh"),  # GPT-2's GELU
            nn.Linear(4 * width, width),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A GPT-2-style causal language model; build it with `gpt_model`."""

    def __init__(self, vocab_size: int, context: int, layers: int, heads: int, width: int, dropout: float) -> None:
        super().__init__()
        self.context = context
        self.wte = nn.Embedding(vocab_size, width)
        self.wpe = nn.Embedding(context, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(_Block(width, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        self._init_weights(layers)

    def _init_weights(self, layers: int) -> None:
        # GPT-2's initialisation; the residual projections are scaled down so the residual stream's variance
        # does not grow with depth.
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("attn.proj", "mlp.2")) else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> LMOutput:
        """Logits for every position and, given labels, the next-token loss.

        Args:
            input_ids: Token ids, ``[batch, length]`` with ``length <= context``.
            attention_mask: 1 for real tokens, 0 for padding. Accepted for API compatibility and not used: with
                right padding (as `pad_collate` pads) causal attention already keeps every real token from seeing
                padding, and leaving the mask out keeps the fused attention kernels. Left-padded batches are not
                supported.
            labels: Usually ``input_ids`` with padding set to -100; shifted here, so position ``t`` predicts
                ``labels[:, t + 1]``.

        Returns:
            An `LMOutput`; its ``loss`` is None when ``labels`` is None.

        Raises:
            ValueError: If the sequence is longer than the model's context.
        """
        del attention_mask  # see the docstring: right padding needs no mask under causal attention
        length = input_ids.shape[1]
        if length > self.context:
            raise ValueError(f"sequence length {length} exceeds the model's context of {self.context} tokens")
        positions = torch.arange(length, device=input_ids.device)
        x = self.drop(self.wte(input_ids) + self.wpe(positions))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if labels is not None:
            # Shift the labels rather than the logits: slicing the logits would copy the largest tensor of the step.
            targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX)
        return LMOutput(loss=loss, logits=logits)


def gpt_model(
    vocab_size: int = 50304,
    context: int = 1024,
    layers: int = 12,
    heads: int = 12,
    width: int = 768,
    dropout: float = 0.0,
) -> nn.Module:
    """A GPT-2-small-shaped causal language model with random weights (124M parameters at the defaults).

    Token and learned position embeddings, pre-norm transformer blocks with causal self-attention
    (``scaled_dot_product_attention(is_causal=True)``) and a 4x GELU MLP, a final LayerNorm and an LM head tied to
    the token embedding. ``forward(input_ids, attention_mask=None, labels=None)`` returns an `LMOutput` whose
    ``loss`` is the next-token cross-entropy, so a config can set ``loss: null``. The default vocabulary is
    GPT-2's 50257 rounded up to a multiple of 64, which the matrix kernels prefer.

    Args:
        vocab_size: Number of token ids.
        context: Longest sequence the model accepts (rows of the position embedding).
        layers: Number of transformer blocks.
        heads: Attention heads per block; must divide ``width``.
        width: Model (embedding) width.
        dropout: Dropout probability on embeddings, attention and residual branches.

    Returns:
        The model, on the CPU, in training mode.

    Raises:
        ValueError: If an argument is out of range.
    """
    validate(vocab_size=vocab_size, context=context, layers=layers, heads=heads, width=width)
    if width % heads:
        raise ValueError(f"heads must divide width, got width={width}, heads={heads}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
    return GPT(vocab_size, context, layers, heads, width, dropout)
