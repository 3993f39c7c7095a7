"""A small training run with one slow thing planted in a named function of
its own, for the stacks' tests (fullburn's "where", docs/stacks.md): the
planted function must come out on top at its file:line, whatever trainer
runs it. Nothing of fullburn in it.

  python3 planted.py --plant transform [--workers 2 --start spawn]
      each sample's slow_augment() burns 6 ms of CPU (in-process, or in the
      DataLoader's workers): input-bound
  python3 planted.py --plant collate [--workers N]
      the batch's pad_collate() burns 40 ms: input-bound
  python3 planted.py --plant logger
      log_metrics() calls loss.item() and sleeps 30 ms after each step:
      the loop's own work
  python3 planted.py --plant layer
      the model's middle layer ("heavy") burns 8 ms in its forward, for
      fullburn run --layers
  python3 planted.py --plant oom
      the middle layer raises torch.cuda.OutOfMemoryError at step 5, as a
      GPU out of memory would (a CPU run's stand-in for one)
  --trainer plain | lightning | hf   a hand-written loop, Lightning's
      Trainer.fit (the logger a Callback), the HF Trainer (a TrainerCallback;
      TrainingArguments from the command line, as HF's example scripts take
      them: --dataloader_num_workers N ...)

Each planted line ends in "# planted: NAME", so a test finds its line.
"""
import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

SAMPLE_MS = 6.0
COLLATE_MS = 40.0
LOG_SLEEP_S = 0.03
WARMUP = 5


def slow_augment(x, ms):
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end: x = x * 1.0  # planted: transform
    return x


def pad_collate(items):
    end = time.perf_counter() + COLLATE_MS / 1000
    while time.perf_counter() < end: pass  # planted: collate
    xs, ys = zip(*items)
    return torch.stack(xs), torch.stack(ys)


def log_metrics(step, loss, history):
    history.append(loss.item())
    time.sleep(LOG_SLEEP_S)  # planted: logger


class Heavy(nn.Module):
    """A layer whose forward costs 8 ms of CPU (or runs out of memory)."""

    def __init__(self, oom_at=0):
        super().__init__()
        self.proj = nn.Linear(64, 64)
        self.calls, self.oom_at = 0, oom_at

    def forward(self, x):
        self.calls += 1
        if self.oom_at and self.calls == self.oom_at:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        end = time.perf_counter() + 0.008
        while time.perf_counter() < end: pass  # planted: layer
        return torch.relu(self.proj(x))


class Layered(nn.Module):
    def __init__(self, oom_at=0):
        super().__init__()
        self.embed = nn.Linear(64, 256)
        self.squeeze = nn.Linear(256, 64)
        self.heavy = Heavy(oom_at)
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        return self.head(self.heavy(self.squeeze(torch.relu(self.embed(x)))))


class Points(Dataset):
    """Random 64-feature points of 4 classes; `augment_ms` of CPU per sample."""

    def __init__(self, n, augment_ms=0.0, as_dict=False):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 64, generator=g)
        self.y = torch.randint(0, 4, (n,), generator=g)
        self.augment_ms, self.as_dict = augment_ms, as_dict

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = slow_augment(self.x[i], self.augment_ms) if self.augment_ms else self.x[i]
        if self.as_dict:
            return {"x": x, "labels": self.y[i]}
        return x, self.y[i]


PLANT = None


def make_model():
    if PLANT in ("layer", "oom"):
        return Layered(oom_at=5 if PLANT == "oom" else 0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def plain(a, data, collate):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(data, batch_size=8, shuffle=True, num_workers=a.workers,
                        collate_fn=collate, multiprocessing_context=a.start if a.workers else None)
    history, step, t0 = [], 0, None
    while step < a.steps:
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if a.plant == "logger":
                log_metrics(step, loss, history)
            step += 1
            if step == WARMUP:
                t0 = time.perf_counter()
            if step == a.steps:
                break
    if a.print_rate and t0 is not None:  # for bench/vs_traceml: steps/s after the warm-up
        print("steps/s %.4f" % ((a.steps - WARMUP) / (time.perf_counter() - t0)), flush=True)


def lightning(a, data, collate):
    import lightning as L

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = make_model()

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    class Logger(L.Callback):
        def __init__(self):
            self.history = []

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            log_metrics(batch_idx, outputs["loss"], self.history)

    loader = DataLoader(data, batch_size=8, shuffle=True, num_workers=a.workers,
                        collate_fn=collate, multiprocessing_context=a.start if a.workers else None,
                        persistent_workers=a.workers > 0)
    trainer = L.Trainer(max_steps=a.steps, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0,
                        callbacks=[Logger()] if a.plant == "logger" else [])
    trainer.fit(Net(), train_dataloaders=loader)


def hf(a, data, collate, rest):
    import os
    import tempfile

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import HfArgumentParser, Trainer, TrainerCallback, TrainingArguments

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = make_model()

        def forward(self, x, labels=None):
            logits = self.net(x)
            return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}

    class Logger(TrainerCallback):
        def __init__(self):
            self.history = []
            self.last = torch.zeros(())

        def on_step_end(self, args, state, control, **kwargs):
            log_metrics(state.global_step, self.last, self.history)

    def dict_collate(items):
        x, y = pad_collate([(i["x"], i["labels"]) for i in items])
        return {"x": x, "labels": y}

    # As HF's example scripts take them: TrainingArguments from the command
    # line (--dataloader_num_workers N, ...), after the script's own options.
    defaults = ["--output_dir", tempfile.mkdtemp(prefix="planted_hf_"), "--max_steps", str(a.steps),
                "--per_device_train_batch_size", "8", "--learning_rate", "0.05", "--report_to", "none",
                "--use_cpu", "--save_strategy", "no", "--disable_tqdm", "true",
                "--logging_steps", "1000000"]
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(args=defaults + rest)
    Trainer(model=Classifier(), args=args, train_dataset=data,
            data_collator=dict_collate if collate else (lambda items: {
                "x": torch.stack([i["x"] for i in items]),
                "labels": torch.stack([i["labels"] for i in items])}),
            callbacks=[Logger()] if a.plant == "logger" else []).train()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--plant", choices=["transform", "collate", "logger", "layer", "oom"], required=True)
    p.add_argument("--trainer", choices=["plain", "lightning", "hf"], default="plain")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("-j", "--workers", type=int, default=0,
                   help="the DataLoader's num_workers (the HF Trainer: --dataloader_num_workers)")
    p.add_argument("--print-rate", action="store_true",
                   help="print the steps per second after the first 5 (a plain loop's)")
    p.add_argument("--start", choices=["fork", "spawn"], default="fork",
                   help="the workers' start method (multiprocessing_context)")
    a, rest = p.parse_known_args()
    if a.trainer == "hf" and a.start != "fork":
        p.error("--start spawn: the HF Trainer makes its own DataLoader (fork)")
    if rest and a.trainer != "hf":
        p.error("unrecognized arguments: " + " ".join(rest))
    global PLANT
    PLANT = a.plant
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = Points(4096, SAMPLE_MS if a.plant == "transform" else 0.0, as_dict=a.trainer == "hf")
    collate = pad_collate if a.plant == "collate" else None
    if a.trainer == "hf":
        hf(a, data, collate, rest)
    else:
        {"plain": plain, "lightning": lightning}[a.trainer](a, data, collate)


if __name__ == "__main__":
    main()
