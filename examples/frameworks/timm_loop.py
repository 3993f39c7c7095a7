"""A timm model trained in a plain loop with timm's optimizer factory and
scheduler, as timm's users write one. Nothing of fullburn in it; run it under
`fullburn run -- python timm_loop.py [--steps N]`.
"""
import argparse

import timm
import timm.optim
import timm.scheduler
import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    a = p.parse_args()
    torch.manual_seed(0)
    model = timm.create_model("resnet18", num_classes=10, pretrained=False)
    optimizer = timm.optim.create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
    scheduler = timm.scheduler.CosineLRScheduler(optimizer, t_initial=a.steps)
    data = TensorDataset(torch.randn(512, 3, 32, 32), torch.randint(0, 10, (512,)))
    loader = DataLoader(data, batch_size=16, shuffle=True)
    loss_fn = torch.nn.CrossEntropyLoss()
    model.train()
    for step, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step_update(step + 1)
        if step + 1 == a.steps:
            break


if __name__ == "__main__":
    main()
