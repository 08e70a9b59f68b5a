"""A Hugging Face Trainer script, unedited by tunekit: its training DataLoader is built by the Trainer (accelerate's
DataLoaderShard over a batch sampler) at --per-device-batch, not at the loader's batch_size."""

import argparse
import time

import torch
from transformers import Trainer, TrainingArguments


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        time.sleep(0.001)
        return {"x": torch.full((8,), float(i % 5)), "labels": torch.tensor(i % 2)}


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 2)

    def forward(self, x, labels=None):
        logits = self.lin(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


parser = argparse.ArgumentParser()
parser.add_argument("--per-device-batch", type=int, default=16)
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--out", default="hf-out")
args = parser.parse_args()
training = TrainingArguments(
    output_dir=args.out,
    per_device_train_batch_size=args.per_device_batch,
    dataloader_num_workers=args.workers,
    max_steps=100000,
    report_to=[],
    save_strategy="no",
    logging_strategy="no",
    use_cpu=True,
    disable_tqdm=True,
)
Trainer(model=Tiny(), args=training, train_dataset=Rows()).train()
