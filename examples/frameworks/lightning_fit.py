"""A Lightning training run as people write one: a LightningModule, a
LightningDataModule, Trainer.fit. Nothing of fullburn in it; run it under
`fullburn run -- python lightning_fit.py [--starved] [--accumulate N]
[--precision bf16-mixed] [--val-every N] [--checkpoint-every N] [--steps N]
[--accelerator gpu]`.

--starved plants the usual input bottleneck: a transform that takes 8 ms per
sample in a DataLoader without workers (num_workers=0, the default here,
which suits the in-memory tensors of the healthy variant).
"""
import argparse
import tempfile
import time

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Shapes(Dataset):
    """Synthetic 3x32x32 images of 10 classes; `delay_s` of work per sample."""

    def __init__(self, n, delay_s=0.0, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 3, 32, 32, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)
        self.delay_s = delay_s

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        if self.delay_s:
            end = time.perf_counter() + self.delay_s
            while time.perf_counter() < end:  # a decode and augmentation's CPU time
                pass
        return self.x[i], self.y[i]


class ShapesData(L.LightningDataModule):
    def __init__(self, batch_size=32, num_workers=2, delay_s=0.0):
        super().__init__()
        self.batch_size, self.num_workers, self.delay_s = batch_size, num_workers, delay_s

    def setup(self, stage=None):
        self.train_set = Shapes(4096, self.delay_s, seed=0)
        self.val_set = Shapes(2048, 0.0, seed=1)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True,
                          num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)


class SmallNet(L.LightningModule):
    def __init__(self, lr=0.05):
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--starved", action="store_true")
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--precision", default="32-true")
    p.add_argument("--val-every", type=int, default=0, help="validate every N steps (0: never)")
    p.add_argument("--val-batches", type=int, default=4, help="batches per validation")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="ModelCheckpoint every N steps into a temporary folder (0: no checkpoints)")
    p.add_argument("--workers", type=int, default=0,
                   help="the DataLoader's num_workers (0 suits tensors already in memory)")
    p.add_argument("--accelerator", default="cpu", help="Lightning's accelerator: cpu, gpu, auto")
    a = p.parse_args()
    torch.manual_seed(0)
    data = ShapesData(num_workers=a.workers, delay_s=0.008 if a.starved else 0.0)
    callbacks = []
    if a.checkpoint_every:
        callbacks.append(ModelCheckpoint(dirpath=tempfile.mkdtemp(prefix="lightning_fit_"),
                                         every_n_train_steps=a.checkpoint_every, save_top_k=-1))
    trainer = L.Trainer(max_steps=a.steps, accelerator=a.accelerator, devices=1,
                        accumulate_grad_batches=a.accumulate, precision=a.precision,
                        logger=False, enable_checkpointing=bool(callbacks), callbacks=callbacks,
                        enable_progress_bar=False,
                        enable_model_summary=False,
                        limit_val_batches=a.val_batches if a.val_every else 0,
                        val_check_interval=a.val_every or None,
                        check_val_every_n_epoch=None if a.val_every else 1)
    trainer.fit(SmallNet(), datamodule=data)


if __name__ == "__main__":
    main()
