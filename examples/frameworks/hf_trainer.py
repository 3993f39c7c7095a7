"""A Hugging Face transformers.Trainer run as people write one: a small
randomly initialised model built from a config (no download), a dataset, and
TrainingArguments. Nothing of fullburn in it; run it under
`fullburn run -- python hf_trainer.py [--starved] [--eval-every N] [--save-every N] [--steps N]
[--device cuda]`.

--starved plants the usual input bottleneck: the dataset does 30 ms of CPU
work per sample (tokenizing on the fly) while the Trainer's DataLoader has
no workers (dataloader_num_workers=0, its default).
"""
import argparse
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Sentences(Dataset):
    """Synthetic token sequences of 2 classes; `delay_s` of work per sample."""

    def __init__(self, n, length=32, vocab=512, delay_s=0.0, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(5, vocab, (n, length), generator=g)
        self.labels = (self.ids[:, 0] % 2).long()
        self.delay_s = delay_s

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        if self.delay_s:
            end = time.perf_counter() + self.delay_s
            while time.perf_counter() < end:  # tokenization's CPU time
                pass
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]),
                "labels": self.labels[i]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--starved", action="store_true")
    p.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps (0: never)")
    p.add_argument("--val-samples", type=int, default=512, help="the evaluation set's size")
    p.add_argument("--save-every", type=int, default=0, help="save a checkpoint every N steps (0: never)")
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--workers", type=int, default=0,
                   help="dataloader_num_workers (0, the Trainer's default, suits in-memory data)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: the Trainer's own device choice (use_cpu=False)")
    a = p.parse_args()
    torch.manual_seed(0)
    config = BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=64, num_labels=2)
    model = BertForSequenceClassification(config)
    out = tempfile.mkdtemp(prefix="hf_trainer_")
    args = TrainingArguments(
        output_dir=out, max_steps=a.steps, per_device_train_batch_size=16,
        per_device_eval_batch_size=32, gradient_accumulation_steps=a.accumulate,
        learning_rate=1e-3, logging_steps=10, report_to=[], use_cpu=a.device == "cpu",
        dataloader_num_workers=a.workers,
        eval_strategy="steps" if a.eval_every else "no", eval_steps=a.eval_every or None,
        save_strategy="steps" if a.save_every else "no", save_steps=a.save_every or 500,
        disable_tqdm=True)
    train = Sentences(4096, delay_s=0.03 if a.starved else 0.0)
    val = Sentences(a.val_samples, seed=1)
    Trainer(model=model, args=args, train_dataset=train, eval_dataset=val).train()


if __name__ == "__main__":
    main()
