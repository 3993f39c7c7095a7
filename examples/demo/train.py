"""A small image classifier trained the way many first scripts are: a Dataset
whose __getitem__ decodes and augments each photo on the CPU, a DataLoader
with its default num_workers=0, a plain loop. Nothing of fullburn in it.

It is starved on purpose: augment() blurs and resizes a full-size image for
every sample, in the training process, between steps. `scripts/demo.sh`
runs it under `fullburn run`, then again with the fix fullburn names
(`--workers 1`: the augmentation moves to a worker process and overlaps the
training), and compares the two.

  python3 train.py [--workers N] [--epochs N] [--batch-size N]
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def augment(image, generator):
    """What a photo pipeline does to each sample: a blur, a resize to the
    training size, a random flip, normalization. On a 320x320 photo this is
    most of a step's time."""
    channels = image.shape[0]
    kernel = torch.ones(channels, 1, 7, 7) / 49
    blurred = F.conv2d(image.unsqueeze(0), kernel, padding=3, groups=channels)
    small = F.interpolate(blurred, size=(64, 64), mode="bilinear", align_corners=False)[0]
    if torch.rand(1, generator=generator).item() < 0.5:
        small = small.flip(-1)
    return (small - 0.5) / 0.25


class Photos(torch.utils.data.Dataset):
    """Synthetic 320x320 "photos" of 10 classes: each class a color and a
    stripe frequency, with noise, made from the sample's index."""

    def __init__(self, count, seed=0):
        self.count = count
        self.seed = seed

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        g = torch.Generator().manual_seed(self.seed * 100003 + index)
        label = index % 10
        x = torch.linspace(0, 1, 320)
        stripes = torch.sin(x * (label + 1) * 6.283).expand(320, 320)
        color = torch.tensor([(label % 3) / 2, (label % 5) / 4, (label % 2) * 1.0]).view(3, 1, 1)
        photo = (0.5 * stripes + 0.5 * color + 0.3 * torch.rand(3, 320, 320, generator=g)).clamp(0, 1)
        return augment(photo, g), label


class SmallNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(64, classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--samples", type=int, default=640)
    args = p.parse_args()
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(Photos(args.samples), batch_size=args.batch_size,
                                         shuffle=True, num_workers=args.workers)
    model = SmallNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = time.time()
    for epoch in range(args.epochs):
        correct = seen = 0
        for images, labels in loader:
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            correct += int((logits.argmax(1) == labels).sum())
            seen += len(labels)
        print("epoch %d: loss %.3f, train accuracy %.0f%%, %.1f s" %
              (epoch + 1, loss.item(), 100 * correct / seen, time.time() - start), flush=True)


if __name__ == "__main__":
    main()
