#!/usr/bin/python3
"""Writes fixtures/torch113_cpu_dataloader.json: a CPU-only profiler trace from
Debian's torch 1.13 (its legacy profiler: a bare JSON array, no categories) of a
loop whose DataLoader (num_workers=0) sleeps SAMPLE_MS per sample, so each
step waits at least BATCH * SAMPLE_MS ms in enumerate(DataLoader)...__next__.

usage: /usr/bin/python3 tests/analyze/make_cpu_trace.py [OUT]
"""
import os, sys, time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

SAMPLE_MS = 3  # tests/analyze/analyze_test.cpp relies on these two
BATCH = 4


class Slow(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(SAMPLE_MS / 1000)
        return torch.full((16,), float(i)), torch.tensor(i % 2)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "fixtures", "torch113_cpu_dataloader.json")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Slow(), batch_size=BATCH, num_workers=0)
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=4, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=schedule,
                                on_trace_ready=lambda p: p.export_chrome_trace(out)) as prof:
        for step, (x, y) in enumerate(loader):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
            if step >= 5:
                break
    print(out, os.path.getsize(out), "bytes")


if __name__ == "__main__":
    main()
