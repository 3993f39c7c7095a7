"""A training loop's shape without a model, for fullburn's scenario tests and
the README tour: a loader (worker processes) feeds a consumer that stands in
for the device. Marks its steps and a final evaluation with
python/fullburn_markers.py.

  python3 loop.py starved  --seconds S   one worker, 40 ms of CPU per batch,
                                         10 ms of "device" work: input-bound
  python3 loop.py compute  --seconds S   two workers, 5 ms per batch, 40 ms of
                                         device work: compute-bound (healthy)
  python3 loop.py stalls   --seconds S   as compute, and every 10th step a
                                         400 ms blocking save: step stalls
  python3 loop.py disk     --seconds S --file F
                                         batches read from F past the page cache
                                         (posix_fadvise DONTNEED): storage-bound
"""
import argparse
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from fullburn_markers import Markers, steps  # noqa: E402


def burn(seconds):
    end = time.perf_counter() + seconds
    x = 0.0
    while time.perf_counter() < end:
        for i in range(2000):
            x += i * 1e-9
    return x


def worker(queue, decode_s):
    while True:
        burn(decode_s)
        queue.put(b"x" * 4096)


def cpu_loader(workers, decode_s, seconds):
    queue = mp.Queue(maxsize=8)
    procs = [mp.Process(target=worker, args=(queue, decode_s), daemon=True) for _ in range(workers)]
    for p in procs:
        p.start()
    end = time.time() + seconds
    try:
        while time.time() < end:
            yield [queue.get()] * 32
    finally:
        for p in procs:
            p.terminate()


def disk_loader(path, seconds, chunk=4 << 20):
    """Random 4 MiB reads, dropped from the page cache first: every read waits on the disk."""
    fd = os.open(path, os.O_RDONLY)
    chunks = max(1, os.fstat(fd).st_size // chunk)
    end, k = time.time() + seconds, 0
    try:
        while time.time() < end:
            offset = (k * 7919 % chunks) * chunk
            k += 1
            os.posix_fadvise(fd, offset, chunk, os.POSIX_FADV_DONTNEED)
            data = os.pread(fd, chunk, offset)
            yield [data] * 32
    finally:
        os.close(fd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["starved", "compute", "stalls", "disk"])
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--file")
    args = ap.parse_args()
    if args.mode == "starved":
        loader, device_s = cpu_loader(1, 0.040, args.seconds), 0.010
    elif args.mode in ("compute", "stalls"):
        loader, device_s = cpu_loader(2, 0.005, args.seconds), 0.040
    else:
        if not args.file:
            sys.exit("loop.py disk: --file F is required (a file of a few MB or more)")
        loader, device_s = disk_loader(args.file, args.seconds), 0.0005
    n = 0
    markers = Markers()
    for batch in steps(loader, markers=markers):
        time.sleep(device_s)  # the device's work: the host waits, its CPU idles
        n += len(batch)
        if args.mode == "stalls" and markers.step % 10 == 9:
            time.sleep(0.4)  # a synchronous save inside the loop (markers.step: steps ended)
    # A held-out pass at the end, as a training script has; its numbers
    # stand in for a model's (the report draws them).
    with markers.phase("evaluation") as result:
        time.sleep(device_s)
        result.update(val_loss=1.25, val_accuracy=0.5)
    print(f"{args.mode}: {n} samples")


if __name__ == "__main__":
    main()
