"""The data of the text example: synthetic documents tokenized per sample (bytes as tokens), a padding collate,
and the count of real (non-padding) tokens in a batch."""

from __future__ import annotations

import random

import torch
from torch.utils.data import Dataset

PAD = 0
WORDS = (
    "the loader feeds the model while the model trains on what the loader made before it "
    "every batch waits for its slowest sample and every worker decodes one sample at a time"
).split()


class Documents(Dataset):
    """``count`` documents of 16 to ``max_len`` byte tokens, made and tokenized when a sample is asked for."""

    def __init__(self, count: int = 20_000, max_len: int = 256):
        self.count, self.max_len = count, max_len

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        rng = random.Random(index)
        length = rng.randint(16, self.max_len)
        text = " ".join(rng.choice(WORDS) for _ in range(length // 4))
        tokens = [min(255, b) + 1 for b in text.encode()][:length]  # 1 ... 256; 0 is padding
        return torch.tensor(tokens, dtype=torch.long)


def pad_collate(samples: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Pad a batch to its longest document; the mask marks real tokens."""
    longest = max(len(s) for s in samples)
    ids = torch.full((len(samples), longest), PAD, dtype=torch.long)
    for i, s in enumerate(samples):
        ids[i, : len(s)] = s
    return {"input_ids": ids, "mask": ids != PAD}


def count_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Real tokens in a batch: what the throughput of a language model counts."""
    return int(batch["mask"].sum())
