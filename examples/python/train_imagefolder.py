"""A plain PyTorch image-classification loop (ResNet-18 at a width multiplier,
SGD with momentum) whose input is torchvision's ImageFolder + DataLoader or,
with --loader fullburn, fullburn.ImageLoader: the two lines that change are
marked SWAP. bench/python_swap_train runs it both ways on the same cores.

  python3 train_imagefolder.py DATA --loader torch|fullburn [--steps N] [--device cuda]
"""
import argparse
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, classes, width=0.25):
        super().__init__()
        w = [max(8, int(c * width)) for c in (64, 128, 256, 512)]
        self.stem = nn.Sequential(nn.Conv2d(3, w[0], 7, 2, 3, bias=False), nn.BatchNorm2d(w[0]),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], w[0]
        for i, c in enumerate(w):
            layers += [Block(cin, c, 1 if i == 0 else 2), Block(c, c, 1)]
            cin = c
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--loader", choices=["torch", "fullburn"], default="torch")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--crop", type=int, default=112)
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu or cuda: where the model trains")
    a = p.parse_args()
    device = torch.device(a.device)
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    if a.loader == "torch":
        import torchvision
        from torchvision import transforms
        tf = transforms.Compose([transforms.RandomResizedCrop(a.crop), transforms.RandomHorizontalFlip(),
                                 transforms.ToTensor(),
                                 transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
        dataset = torchvision.datasets.ImageFolder(a.data, tf)  # SWAP
        loader = torch.utils.data.DataLoader(dataset, batch_size=a.batch_size, shuffle=True,  # SWAP
                                             num_workers=a.workers, drop_last=True,
                                             persistent_workers=a.workers > 0)
        classes = len(dataset.classes)
    else:
        import fullburn
        # On CUDA the loader copies and normalizes on the device itself.
        loader = fullburn.ImageLoader(a.data, a.batch_size, crop=a.crop, seed=a.seed,  # SWAP
                                      device=None if device.type == "cpu" else device)
        classes = len(loader.classes)
    model = ResNet18(classes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-5)
    step, wait, t0, start = 0, 0.0, None, time.perf_counter()
    while step < a.steps:
        fetch = time.perf_counter()
        for images, labels in loader:
            if step == 3:  # warm-up done: time from here
                t0, wait = time.perf_counter(), 0.0
            wait += time.perf_counter() - fetch
            images = images.to(device, non_blocking=True)  # no-ops where they are there already
            labels = labels.to(device, non_blocking=True)
            loss = F.cross_entropy(model(images), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            print("step %d loss %.4f" % (step, loss.item()), flush=True)
            if step >= a.steps:
                break
            fetch = time.perf_counter()
    took = time.perf_counter() - t0
    print("samples/s %.1f data_wait %.3f" % ((a.steps - 3) * a.batch_size / took, wait / took))


if __name__ == "__main__":
    main()
