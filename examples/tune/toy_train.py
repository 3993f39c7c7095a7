"""A stand-in training script whose speed depends on its arguments, for
`fullburn tune --grid` (the README tour and the tests). No dependencies.

Each step "loads" a batch (sleeps longer with fewer workers, and with more
workers than cores=2 it pays for contention) and "computes" it (a fixed
launch overhead plus a per-sample cost), so throughput rises with the batch
size and peaks at --workers 2. --batch-size above 512 fails the way a GPU
out-of-memory does. Marks its steps with python/fullburn_markers.py, and with
--print also prints "throughput: N samples/s" lines for --metric-regex.

  python3 toy_train.py --batch-size 128 --workers 2 --seconds 5
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from fullburn_markers import steps  # noqa: E402


def batches(batch_size, workers, seconds):
    end = time.monotonic() + seconds
    # 50 us a sample: one worker against two is 1.5x slower at batch 128, a
    # margin sleeps on a busy machine do not blur.
    load_s = batch_size * 50e-6 * (2.0 / min(workers, 2) + max(0, workers - 2))
    while time.monotonic() < end:
        time.sleep(load_s)
        yield [0] * batch_size


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--print", action="store_true", help="print throughput lines")
    a = p.parse_args()
    if a.batch_size > 512:
        print(f"RuntimeError: CUDA out of memory (batch {a.batch_size})", file=sys.stderr)
        sys.exit(3)
    last = time.monotonic()
    for batch in steps(batches(a.batch_size, a.workers, a.seconds)):
        time.sleep(0.004 + len(batch) * 20e-6)  # launch overhead + per-sample compute
        now = time.monotonic()
        if a.print:
            print(f"step done, throughput: {len(batch) / (now - last):.1f} samples/s", flush=True)
        last = now


if __name__ == "__main__":
    main()
