"""A plain PyTorch training script with no fullburn code in it: `fullburn run`
times its steps by itself (python/fullburn_autosteps/). For the tests and
the README tour; needs torch (Debian's python3-torch: /usr/bin/python3).

Each sample "arrives" after --sample-ms of waiting (a slow disk or network
read, no CPU), so the loop is input-bound; a small MLP trains on it with SGD,
accumulating --accumulate micro-batches per optimizer step, and a validation
pass under torch.no_grad() follows every epoch.

  python3 plain_torch.py --workers 0 --epochs 2
  python3 plain_torch.py --markers      # marks its own steps with fullburn_markers instead
  python3 plain_torch.py --markers-by-hand --validate-first
                                        # Markers().step_end() by hand, after a validation pass
  python3 plain_torch.py --fail-at 5    # dies after optimizer step 5 the way a GPU OOM does
  python3 plain_torch.py --log-ms 20    # 20 ms of synchronous logging after each step
  python3 plain_torch.py --workers 2 --slow-start-s 8
                                        # with DataLoader workers, 8 s before the first batch
  python3 plain_torch.py --save-every 4 --save-mb 200 --save-dir /tmp/ck
                                        # a synchronous torch.save every 4 steps
                                        # (--save-in-thread: on a background thread)
  fullburn launch --nproc 2 -- python3 plain_torch.py --slow-rank 1
                                        # DistributedDataParallel over Gloo; rank 1 reads slower
"""
import argparse
import copy
import os
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def checkpoint_state(model, opt, step, pad):
    """What a real checkpoint holds, copied (the loop goes on changing the
    model), with `pad` (--save-mb) standing in for a larger model's weights."""
    return {"model": copy.deepcopy(model.state_dict()),
            "optimizer": copy.deepcopy(opt.state_dict()), "step": step, "pad": pad}


def validate(model, val):
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in val:
            correct += int((model(x).argmax(1) == y).sum())
    model.train()
    return correct / len(val.dataset)


def log_step(step, loss, seconds):
    """What a loop does after its step when it logs synchronously: a
    metrics call that waits on a server, a print to a slow terminal."""
    time.sleep(seconds)
    return step, float(loss)


class SlowReads(torch.utils.data.Dataset):
    def __init__(self, n, sample_s, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 32, generator=g)
        self.y = (self.x[:, :16].sum(1) > 0).long()
        self.sample_s = sample_s

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(self.sample_s)
        return self.x[i], self.y[i]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--accumulate", type=int, default=2)
    p.add_argument("--sample-ms", type=float, default=3)
    p.add_argument("--markers", action="store_true", help="mark steps with fullburn_markers.steps")
    p.add_argument("--markers-by-hand", action="store_true",
                   help="mark steps with fullburn_markers.Markers().step_end()")
    p.add_argument("--validate-first", action="store_true", help="a validation pass before training")
    p.add_argument("--fail-at", type=int, default=0, help="raise after this optimizer step")
    p.add_argument("--slow-rank", type=int, default=-1, help="this rank reads 3x slower")
    p.add_argument("--save-every", type=int, default=0, help="torch.save every N optimizer steps")
    p.add_argument("--save-mb", type=float, default=1, help="checkpoint size")
    p.add_argument("--save-dir", default=".", help="where checkpoint.pt goes")
    p.add_argument("--save-in-thread", action="store_true", help="save on a background thread")
    p.add_argument("--manual-update", action="store_true",
                   help="no optimizer object: update the parameters by hand after backward()")
    p.add_argument("--log-ms", type=float, default=0,
                   help="work after each optimizer step (synchronous logging, metrics)")
    p.add_argument("--slow-start-s", type=float, default=0,
                   help="with DataLoader workers (as given or as tuned), this long before the first "
                        "batch: a worker's set-up, such as opening a remote dataset")
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1  # under torchrun or fullburn launch
    rank = 0
    if distributed:
        torch.distributed.init_process_group("gloo")
        rank = torch.distributed.get_rank()
    sample_s = a.sample_ms / 1000 * (3 if rank == a.slow_rank else 1)
    data = SlowReads(a.samples, sample_s, 1)
    sampler = torch.utils.data.DistributedSampler(data) if distributed else None
    train = torch.utils.data.DataLoader(data, batch_size=a.batch_size, shuffle=sampler is None,
                                        sampler=sampler, num_workers=a.workers, drop_last=True)
    val = torch.utils.data.DataLoader(SlowReads(a.samples // 2, a.sample_ms / 1000, 2),
                                      batch_size=2 * a.batch_size)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    opt = None if a.manual_update else torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    wrap = lambda loader, epoch: loader  # noqa: E731
    if a.markers:
        from fullburn_markers import steps  # on the path under fullburn run
        wrap = lambda loader, epoch: steps(loader, epoch=epoch)  # noqa: E731
    marks = None
    if a.markers_by_hand:
        from fullburn_markers import Markers
        marks = Markers()
    stepped = 0
    saver = None
    if a.validate_first:
        print(f"before training: validation accuracy {validate(model, val):.2f}", flush=True)
    pad = torch.zeros(int(a.save_mb * 2**20) // 4) if a.save_every else None
    if a.slow_start_s and train.num_workers > 0:
        time.sleep(a.slow_start_s)
    for epoch in range(a.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        model.train()
        for i, (x, y) in enumerate(wrap(train, epoch)):
            loss = F.cross_entropy(model(x), y) / a.accumulate
            loss.backward()
            if a.manual_update:  # as older examples do, with no optimizer object
                with torch.no_grad():
                    for p_ in model.parameters():
                        p_ -= 0.1 * p_.grad
                        p_.grad = None
                continue
            if (i + 1) % a.accumulate == 0:
                opt.step()
                opt.zero_grad()
                stepped += 1
                if marks is not None:
                    marks.step_end(samples=a.accumulate * a.batch_size, epoch=epoch)
                if a.log_ms:
                    log_step(stepped, loss, a.log_ms / 1000)
                if a.save_every and stepped % a.save_every == 0 and rank == 0:
                    path = os.path.join(a.save_dir, "checkpoint.pt")
                    state = checkpoint_state(model, opt, stepped, pad)
                    if a.save_in_thread:  # as an async checkpointer does
                        if saver is not None:
                            saver.join()
                        saver = threading.Thread(target=torch.save, args=(state, path))
                        saver.start()
                    else:
                        torch.save(state, path)
                if stepped == a.fail_at:
                    raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated "
                                       "by plain_torch.py --fail-at)")
        print(f"epoch {epoch}: validation accuracy {validate(model, val):.2f}", flush=True)
    if saver is not None:
        saver.join()
    if distributed:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
