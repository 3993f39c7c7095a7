#!/usr/bin/env python3
"""Writes fuzz/corpus/<target>/ from the test fixtures (and, for the
formats no fixture holds, from the writers' documented layouts): small
seeds, a few KB each, so the corpus stays in the repository.

  fuzz/make_corpus.py            # rewrite fuzz/corpus (images: see below)

JPEG and PNG seeds are written by the fuzz build's make_image_seeds (the
project's own encoders): scripts/fuzz.sh --seeds.
"""
import gzip, json, os, struct, zlib, pathlib, shutil

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "fuzz" / "corpus"
SEP = b"\n----\n"


def put(target, name, data):
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def trace_seeds():
    fx = ROOT / "tests" / "analyze" / "fixtures"
    for f in sorted(fx.glob("*.json*")):
        raw = f.read_bytes()
        if f.suffix == ".gz":
            raw = gzip.decompress(raw)
        doc = json.loads(raw)
        # Old profilers wrote a bare array of events.
        events = doc if isinstance(doc, list) else doc.get("traceEvents", [])
        # The first events of each kind the reader tells apart, so a seed
        # keeps CPU ops, kernels, runtime calls, flows and step markers.
        kept, seen = [], {}
        for e in events:
            key = (e.get("ph"), e.get("cat"))
            if seen.get(key, 0) < 6:
                seen[key] = seen.get(key, 0) + 1
                kept.append(e)
        if isinstance(doc, list):
            small = kept
        else:
            small = {k: v for k, v in doc.items() if k != "traceEvents"}
            small["traceEvents"] = kept
        text = json.dumps(small, separators=(",", ":")).encode()
        stem = f.name.split(".")[0]
        put("trace", stem + ".json", text)
    # A gzip seed: the reader inflates by magic bytes.
    put("trace", "pinned.json.gz", (fx / "torch211_h200_pinned.pt.trace.json.gz").read_bytes())


def prom_seeds():
    put("prom_json", "matrix.json",
        '{"status":"success","data":{"resultType":"matrix","result":['
        '{"metric":{"__name__":"x","Hostname":"node \\"a\\"","pod":"caf\\u00e9\\\\1"},'
        '"values":[[1700000000,"1"],[1700000060,"NaN"],[1700000120.5,"2.5e3"]]},'
        '{"metric":{"gpu":"1"},"values":[[1700000060,"+Inf"],[1700000180,"-Inf"]]}]},'
        '"warnings":["something"]}')
    put("prom_json", "vector.json",
        '{"status":"success","data":{"resultType":"vector","result":[{"metric":{"job":"j","gpu":"0"},'
        '"value":[1700000000.25,"0.75"]},{"metric":{},"value":[1.7e9,"1700000000.25"]}]}}')
    put("prom_json", "empty.json", '{"status":"success","data":{"resultType":"matrix","result":[]}}')
    put("prom_json", "error.json",
        '{"status":"error","errorType":"bad_data","error":"1:3: parse error: unexpected \\"}\\""}')
    put("prom_json", "scalar.json", '{"status":"success","data":{"resultType":"scalar","result":[1700000000,"1"]}}')
    # --window and a target's scrapeInterval, as tests/fleet/fleet_test.cpp writes them.
    for name, text in (("window_days", "7d"), ("compound", "1m30s"), ("millis", "250ms"), ("fraction", "1.5h")):
        put("prom_duration", name, text)


def tensor_file(tensors, metadata):
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    meta = dict(metadata)
    meta["crc32"] = str(zlib.crc32(data))
    meta["data_bytes"] = str(len(data))
    header["__metadata__"] = meta
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def tensorfile_seeds():
    put("tensorfile", "two.safetensors", tensor_file(
        [("w", "F32", [2, 3], struct.pack("<6f", *range(6))), ("b", "BF16", [3], b"\x80\x3f" * 3)],
        {"format": "fullburn", "step": "12"}))
    put("tensorfile", "scalar.safetensors", tensor_file([("s", "I64", [], struct.pack("<q", -5))], {}))
    put("tensorfile", "empty.safetensors", tensor_file([("e", "U8", [0, 4], b"")], {"k": "v"}))


def pack_seed(fmt, classes, images):
    index = b"FBPACK01" + struct.pack("<IIQII", 1, fmt, len(images), len(classes), 1)
    for c in classes:
        index += struct.pack("<I", len(c)) + c.encode()
    shard = b"".join(raw for raw, _, _, _ in images)
    index += struct.pack("<Q", len(shard))
    off = 0
    for raw, w, h, label in images:
        index += struct.pack("<IQIHHi", 0, off, len(raw), w, h, label)
        off += len(raw)
    # The harness appends the checksum (fuzz/pack_fuzz.cpp).
    return index + SEP + shard


def pack_seeds():
    put("pack", "raw.bin", pack_seed(1, ["cat", "dog"], [(bytes(2 * 2 * 3), 2, 2, 0), (bytes(range(12)), 2, 2, 1)]))
    put("pack", "jpeg.bin", pack_seed(0, ["a"], [(b"\xff\xd8\xff\xe0" + bytes(28), 4, 4, 0)]))


def tokens_seeds():
    tokens = struct.pack("<40H", *[(i * 37) % 50257 for i in range(40)])
    put("tokens", "nanogpt.bin", b"\x07" + tokens)
    header = struct.pack("<3i", 20240520, 1, 40) + bytes(4 * 253)
    put("tokens", "llmc.bin", b"\x03" + header + tokens)
    put("tokens", "short.bin", b"\x3f" + tokens[:6])


def config_seeds():
    put("config", "toml_and_overrides.txt",
        '[train]\nbatch_size = 32\nprecision = "bf16"\n[optim]\nlr = 1\n[model]\nname = "mlp"\nwidth = 0.5\n'
        '\n----\noptim.lr=0.25\ntrain.batch_size=auto\ndata.bad_samples=skip\n')
    put("config", "typo.txt", '[model]\nname = "mlp"\nwidht = 2.0\n')
    put("config", "base.txt",
        '[data]\nsource = "tokens"\nseq_len = 64\n\n----\nmodel.name=gpt\n\n----\n'
        '{"train":{"batch_size":8,"epochs":2},"model":{"name":"gpt","heads":4},"gone":{"x":1}}')
    put("config", "arrays.txt", 'title = "x"\n[data]\npath = ["a", "b"]\n[[train]]\nsteps = 3\n')


def events_seeds():
    put("events", "steps.jsonl",
        '{"kind":"step","rank":0,"step":12,"epoch":0,"time":1763800000.25,"step_s":0.21,"data_s":0.05,"loss":2.5}\n'
        '{"kind":"step","rank":1,"step":1,"time":1763800001,"step_s":0.2,"loss":NaN,"samples":64}\n'
        '{"kind":"event","name":"evaluation","time":1763800002,"duration_s":1.5,"rank":0,"data":{"acc":0.9}}\n'
        '{"kind":"step","rank":0,"step":3,"time":1763800003,"step_s":0.2,"loss":"inf"}\n'
        '{"kind":"step","rank":0,"step"\n')


def proc_seeds():
    t0 = ROOT / "tests" / "telemetry" / "fixtures" / "t0"
    holders = ROOT / "tests" / "fleet" / "fixtures" / "holders"

    def read(p):
        p = pathlib.Path(p)
        return p.read_bytes() if p.exists() else b""

    root = read(t0 / "root_pid").strip().decode() or "1"
    # The order of fuzz/proc_fuzz.cpp's kFiles.
    files = [read(t0 / "proc/stat"), read(t0 / "proc/meminfo"), read(t0 / "proc/vmstat"),
             read(t0 / "proc/diskstats"), read(t0 / "proc/net/dev"), read(t0 / "proc/loadavg"),
             b"0::/user.slice/job\n5:cpu,cpuacct:/slurm/uid_1/job_77\n", b"150000 100000\n",
             b"usage_usec 10\nnr_periods 10\nnr_throttled 2\nthrottled_usec 5\n",
             read(t0 / "proc" / root / "stat"), read(t0 / "proc" / root / "status"),
             b"SLURM_JOB_ID=77\0HOSTNAME=pod-a\0POD_NAMESPACE=ml\0",
             b"0::/kubepods.slice/kubepods-pod1234abcd_5678.slice/cri-containerd-1.scope\n",
             read(holders / "etc/passwd") or b"root:x:0:0:root:/root:/bin/bash\n",
             b"43 (python3) S 42 43 42 0 -1 4194560 100 0 0 0 250 30 0 0 20 0 4 0 1234 100000 2500 0\n"]
    for name in ("t0", "t1"):
        base = ROOT / "tests" / "telemetry" / "fixtures" / name
        if name == "t1":
            files[0], files[2] = read(base / "proc/stat"), read(base / "proc/vmstat")
        blob = SEP.join(f.rstrip(b"\n") + b"\n" if f else b"" for f in files)
        # Keep the seed small: /proc/vmstat and the like are long.
        put("proc", name + ".txt", blob[:16384])


def stacks_seeds():
    # A recorded job's first stacks (a few KB), and the forms a recording
    # holds besides: a command line of several lines (python -c), a
    # spawned worker's with ';', no line numbers, bytes that are not UTF-8.
    recorded = (ROOT / "tests" / "stacks" / "data" / "workers0_torch113.pyspy").read_bytes()
    put("stacks", "recorded.pyspy", recorded[:recorded.rfind(b"\n", 0, 6000) + 1])
    put("stacks", "forms.pyspy",
        b'process 7:"python -c import time\nx = 123\n";thread (7): MainThread;<module> (<string>:3) 4\n'
        b'process 7:"python t.py";process 9:"python -c from multiprocessing.spawn import spawn_main; '
        b'spawn_main(tracker_fd=5)";thread (9): MainThread;_worker_loop '
        b'(/usr/lib/python3/dist-packages/torch/utils/data/_utils/worker.py:302);step (/a/t.py) 2\n'
        b'process 7:"python t.py";thread (7): MainThread;<module> (/data/caf\xe9/t.py:3) 1\n')


def main():
    for t in ("trace", "prom_json", "prom_duration", "tensorfile", "pack", "tokens", "config", "events",
              "stacks", "proc"):
        shutil.rmtree(OUT / t, ignore_errors=True)
    trace_seeds(); prom_seeds(); tensorfile_seeds(); pack_seeds(); tokens_seeds()
    config_seeds(); events_seeds(); stacks_seeds(); proc_seeds()


if __name__ == "__main__":
    main()
