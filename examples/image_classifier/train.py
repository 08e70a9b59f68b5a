"""Train an image classifier on a folder of JPEGs (torchvision's ImageFolder layout: one folder per class).

An ordinary training script: argparse flags, a Dataset that reads and decodes files, v2 augmentation, AdamW,
gradient clipping, mixed precision on a GPU, a log line every few steps, an evaluation (``--eval N``: on N held-out
images) and a checkpoint per epoch, and a time-stamped line at each epoch's end (the script's own clock over whole
epochs).

    python train.py --data ./data --make-data 512     # writes 512 synthetic JPEGs first, if the folder is empty
    python train.py --data ./data -j 8 -b 128 --epochs 10
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Subset
from torchvision import datasets, models
from torchvision.transforms import v2


def make_data(root: str, count: int, classes: int = 4, size: int = 160) -> None:
    """Synthetic JPEGs in ImageFolder layout (a stand-in for a real dataset)."""
    from PIL import Image

    generator = torch.Generator().manual_seed(0)
    for i in range(count):
        folder = os.path.join(root, f"class{i % classes}")
        os.makedirs(folder, exist_ok=True)
        pixels = (torch.rand(size, size, 3, generator=generator) * 255).to(torch.uint8).numpy()
        Image.fromarray(pixels).save(os.path.join(folder, f"{i:05d}.jpg"), quality=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", required=True, help="ImageFolder root")
    parser.add_argument("--make-data", type=int, default=0, help="write this many synthetic JPEGs if none exist")
    parser.add_argument("-j", "--workers", type=int, default=2, help="DataLoader workers")
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--crop", type=int, default=128)
    parser.add_argument("--arch", default="resnet18", help="a torchvision.models name")
    parser.add_argument("--clip", type=float, default=1.0, help="gradient clipping norm")
    parser.add_argument("--out", default="checkpoints")
    parser.add_argument("--eval", type=int, default=0, help="evaluate on this many held-out images after each epoch")
    parser.add_argument("--persistent", action="store_true", help="keep the training loader's workers across epochs")
    args = parser.parse_args()

    if args.make_data and not os.path.isdir(args.data):
        make_data(args.data, args.make_data)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    augment = v2.Compose(
        [
            v2.RandomResizedCrop(args.crop, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )
    train_set = datasets.ImageFolder(args.data, transform=augment)
    evaluation = None
    if args.eval:  # the last images held out, center-cropped
        center = v2.Compose(
            [
                v2.Resize(args.crop, antialias=True),
                v2.CenterCrop(args.crop),
                v2.ToImage(),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
            ]
        )
        held = list(range(len(train_set) - args.eval, len(train_set)))
        evaluation = DataLoader(
            Subset(datasets.ImageFolder(args.data, transform=center), held),
            batch_size=args.batch_size,
            num_workers=args.workers,
            pin_memory=True,
        )
        train_set = Subset(train_set, list(range(len(train_set) - args.eval)))
        train_set.classes = train_set.dataset.classes
    loader = DataLoader(
        train_set,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=True,
        drop_last=True,
        persistent_workers=args.persistent and args.workers > 0,
    )
    model = getattr(models, args.arch)(num_classes=len(train_set.classes)).to(device)
    model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    os.makedirs(args.out, exist_ok=True)
    begun = time.time()
    for epoch in range(args.epochs):
        model.train()
        started = time.time()
        for step, (images, labels) in enumerate(loader):
            images = images.to(device, non_blocking=True).to(memory_format=torch.channels_last)
            labels = labels.to(device, non_blocking=True)
            with amp:
                loss = loss_fn(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            optimizer.step()
            if step % 20 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.3f}", flush=True)
        seen = len(loader) * args.batch_size
        print(f"epoch {epoch}: {seen / (time.time() - started):.1f} images/s", flush=True)
        if evaluation is not None:
            model.eval()
            right = 0
            with torch.inference_mode(), amp:
                for images, labels in evaluation:
                    images = images.to(device, non_blocking=True).to(memory_format=torch.channels_last)
                    right += int((model(images).argmax(1).cpu() == labels).sum())
            print(f"epoch {epoch}: accuracy {right / args.eval:.3f} on {args.eval} held-out images", flush=True)
        torch.save(model.state_dict(), os.path.join(args.out, f"epoch{epoch}.pt"))
        print(f"epoch {epoch} ended at {time.time() - begun:.2f} s ({seen} training images)", flush=True)


if __name__ == "__main__":
    main()
