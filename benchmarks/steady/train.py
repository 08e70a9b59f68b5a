"""A steady training script for benchmarks/script_overhead.py: the GPU step is the bound and nothing else varies.

Images come from memory (a pool of uint8 tensors, copied per sample), so a few loader workers outrun the model and
the loop never waits on data; an epoch is long enough that none ends inside a trial; nothing is logged or saved.
Against such a loop the meter's own cost in the step is what differs between a trial and the plain clock, and two
plain runs differ by little, so a 1 % overhead can be told from the noise (the image example's JPEG decoding and
per-epoch checkpoints spread two plain runs by 18 % on an H200).

    python train.py -j 4 -b 256 --arch resnet50
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision import models


class MemoryImages(Dataset):
    """``length`` uint8 images of ``size`` px with labels, drawn from a pool of 64 held in memory."""

    def __init__(self, length: int, size: int, classes: int = 10):
        generator = torch.Generator().manual_seed(0)
        self.pool = torch.randint(0, 256, (64, 3, size, size), dtype=torch.uint8, generator=generator)
        self.length, self.classes = length, classes

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.pool[index % 64].clone(), index % self.classes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-j", "--workers", type=int, default=4)
    parser.add_argument("-b", "--batch-size", type=int, default=256)
    parser.add_argument("--arch", default="resnet50", help="a torchvision.models name")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--length", type=int, default=1_000_000, help="samples per epoch")
    parser.add_argument("--epochs", type=int, default=100)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(
        MemoryImages(args.length, args.size),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=True,
        drop_last=True,
    )
    model = getattr(models, args.arch)(num_classes=10).to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    for _ in range(args.epochs):
        for images, labels in loader:
            images = images.to(device, non_blocking=True).to(memory_format=torch.channels_last).float() / 255
            labels = labels.to(device, non_blocking=True)
            with amp:
                loss = loss_fn(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
