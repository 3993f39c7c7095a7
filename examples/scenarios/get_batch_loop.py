"""A nanoGPT-shaped training loop with no fullburn code and no DataLoader: for
the tests and the README tour; needs torch (Debian's python3-torch:
/usr/bin/python3).

get_batch() cuts random windows out of one long token tensor, as nanoGPT's
does out of its memmap; the next micro-batch is fetched between the forward
and its backward(). estimate_loss() under torch.no_grad() runs every
--eval-interval iterations (and at the first and last). --batch-ms adds that
much CPU work to each get_batch() (tokenizing, augmenting), which makes the
loop's own work the bottleneck.

  python3 get_batch_loop.py --iters 20 --grad-accum 2
  python3 get_batch_loop.py --batch-ms 15
  python3 get_batch_loop.py --save-model /tmp/model.pt   # torch.save(model) after each evaluation
  python3 get_batch_loop.py --keywords   # model(idx=x, targets=y), as model(**batch) calls it
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyLM(nn.Module):
    """An embedding, one causal mixing layer and a head; returns the loss
    itself when given targets, as nanoGPT's GPT does."""

    def __init__(self, vocab, width, block):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(block, width)
        self.mix = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        h = self.embed(idx) + self.position(torch.arange(t))
        # Causal: each position sees the running mean of those before it.
        h = h + torch.tanh(self.mix(h.cumsum(1) / torch.arange(1, t + 1).view(1, t, 1)))
        logits = self.head(h)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def busy(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--grad-accum", type=int, default=2)
    p.add_argument("--eval-interval", type=int, default=10)
    p.add_argument("--eval-iters", type=int, default=20)
    p.add_argument("--batch-ms", type=float, default=0, help="CPU work in each get_batch()")
    p.add_argument("--save-model", default="", help="pickle the whole model here after evaluating")
    p.add_argument("--keywords", action="store_true", help="call the model with keywords only")
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    vocab = 64
    # A repeating pattern with noise: learnable, so the loss falls.
    base = torch.arange(20000) % 17
    tokens = {"train": (base + (torch.rand(20000) < 0.05).long() * 7) % vocab,
              "val": (base[:4000] + 3) % vocab}

    def get_batch(split):
        data = tokens[split]
        ix = torch.randint(len(data) - a.block - 1, (a.batch_size,))
        x = torch.stack([data[i:i + a.block] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + a.block] for i in ix])
        busy(a.batch_ms / 1000)
        return x, y

    model = TinyLM(vocab, 64, a.block)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    @torch.no_grad()
    def estimate_loss():
        out = {}
        model.eval()
        for split in ("train", "val"):
            losses = torch.zeros(a.eval_iters)
            for k in range(a.eval_iters):
                x, y = get_batch(split)
                _, loss = model(x, y)
                losses[k] = loss.item()
            out[split] = losses.mean().item()
        model.train()
        return out

    x, y = get_batch("train")
    for it in range(a.iters + 1):
        if it % a.eval_interval == 0 or it == a.iters:
            losses = estimate_loss()
            print(f"iter {it}: train loss {losses['train']:.3f}, val loss {losses['val']:.3f}",
                  flush=True)
            if a.save_model:
                torch.save(model, a.save_model)
        if it == a.iters:
            break
        for _ in range(a.grad_accum):
            _, loss = model(idx=x, targets=y) if a.keywords else model(x, y)
            loss = loss / a.grad_accum
            x, y = get_batch("train")  # while the device would still run the forward
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
