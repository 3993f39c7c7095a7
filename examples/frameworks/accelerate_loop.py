"""A training loop with Hugging Face accelerate, as its docs write one:
Accelerator(gradient_accumulation_steps=N), prepare(), accumulate(),
accelerator.backward(). Nothing of fullburn in it; run it under
`fullburn run -- python accelerate_loop.py [--starved] [--accumulate N] [--steps N]`
(--steps counts optimizer updates).

--starved plants the usual input bottleneck: 10 ms of CPU work per sample
in a DataLoader without workers.
"""
import argparse
import time

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Points(Dataset):
    def __init__(self, n, delay_s=0.0):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 64, generator=g)
        self.y = (self.x.sum(1) > 0).long()
        self.delay_s = delay_s

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        if self.delay_s:
            end = time.perf_counter() + self.delay_s
            while time.perf_counter() < end:  # a feature pipeline's CPU time
                pass
        return self.x[i], self.y[i]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--accumulate", type=int, default=4)
    p.add_argument("--starved", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    accelerator = Accelerator(gradient_accumulation_steps=a.accumulate, cpu=True)
    # Wide enough that a step computes for longer than its batches take to
    # fetch in-process: the run without --starved is the healthy one.
    model = nn.Sequential(nn.Linear(64, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                          nn.Linear(2048, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(Points(8192, 0.01 if a.starved else 0.0), batch_size=16, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    updates = 0
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            updates += 1
            if updates == a.steps:
                break


if __name__ == "__main__":
    main()
