"""A Lightning Trainer script, unedited by tunekit: the Trainer iterates the loader its module builds (through its
CombinedLoader and fit loop) at --batch, with a validation loop after each short epoch."""

import argparse
import time

import lightning.pytorch as pl
import torch


class Rows(torch.utils.data.Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(0.001)
        return torch.full((8,), float(i % 5)), torch.tensor(i % 2)


class Tiny(pl.LightningModule):
    def __init__(self, batch: int, workers: int):
        super().__init__()
        self.lin = torch.nn.Linear(8, 2)
        self.batch, self.workers = batch, workers

    def training_step(self, batch, _):
        x, y = batch
        time.sleep(0.01)
        return torch.nn.functional.cross_entropy(self.lin(x), y)

    def validation_step(self, batch, _):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.lin(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(Rows(1024), batch_size=self.batch, shuffle=True, num_workers=self.workers)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(Rows(64), batch_size=self.batch)


parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=16)
parser.add_argument("--workers", type=int, default=0)
args = parser.parse_args()
trainer = pl.Trainer(
    accelerator="cpu",
    devices=1,
    max_epochs=1000,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    num_sanity_val_steps=0,
)
trainer.fit(Tiny(args.batch, args.workers))
