"""Train a small causal language model on synthetic documents, padded per batch.

python train.py -j 4 -b 32 --steps 1000
"""

from __future__ import annotations

import argparse

import torch
from data import PAD, Documents, pad_collate
from torch import nn
from torch.utils.data import DataLoader


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 257, dim: int = 128, layers: int = 2, heads: int = 4, max_len: int = 512):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(max_len, dim)
        block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n = ids.shape[1]
        x = self.embed(ids) + self.position(torch.arange(n, device=ids.device))
        causal = nn.Transformer.generate_square_subsequent_mask(n, device=ids.device)
        return self.head(self.blocks(x, mask=causal, is_causal=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-j", "--workers", type=int, default=0)
    parser.add_argument("-b", "--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--dim", type=int, default=128)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(
        Documents(max_len=args.max_len),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        collate_fn=pad_collate,
        drop_last=True,
    )
    model = TinyLM(dim=args.dim, max_len=args.max_len).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    step = 0
    while step < args.steps:
        for batch in loader:
            ids = batch["input_ids"].to(device)
            logits = model(ids[:, :-1])
            loss = nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), ignore_index=PAD
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if step % 50 == 0:
                print(f"step {step} loss {loss.item():.3f}", flush=True)
            if step >= args.steps:
                break
    torch.save(model.state_dict(), "lm.pt")


if __name__ == "__main__":
    main()
