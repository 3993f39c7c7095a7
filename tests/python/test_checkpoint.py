"""fullburn.save_async and fullburn.load: round trips, the safetensors
layout (read here by this file's own parser of the format), a kill -9 during
a write, damaged files, a folder that cannot be written."""
import json
import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import unittest
import zlib

import torch

import fullburn


def read_safetensors(path):
    """The format as its specification gives it, independently of fullburn."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    return header, body


class RoundTrip(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="fb_ckpt_")

    def tearDown(self):
        os.chmod(self.tmp, stat.S_IRWXU)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def model_and_optimizer(self):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8),
                                    torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.randn(2, 3, 8, 8)).sum().backward()
        opt.step()
        return model, opt

    def test_a_model_state_dict_comes_back_equal_and_is_plain_safetensors(self):
        model, _ = self.model_and_optimizer()
        path = os.path.join(self.tmp, "model.safetensors")
        state = model.state_dict()
        handle = fullburn.save_async(state, path)
        self.assertEqual(handle.wait(), path)
        self.assertTrue(handle.done())
        back = fullburn.load(path)
        self.assertEqual(list(back), list(state))
        for k in state:
            self.assertTrue(torch.equal(back[k], state[k]), k)
            self.assertEqual(back[k].dtype, state[k].dtype)
        header, body = read_safetensors(path)
        meta = header.pop("__metadata__")
        self.assertEqual(int(meta["crc32"]), zlib.crc32(body))
        self.assertEqual(int(meta["data_bytes"]), len(body))
        for name, info in header.items():
            begin, end = info["data_offsets"]
            t = state[name]
            self.assertEqual(info["shape"], list(t.shape))
            self.assertEqual(body[begin:end], t.contiguous().numpy().tobytes())

    def test_a_whole_training_state_keeps_its_structure(self):
        model, opt = self.model_and_optimizer()
        state = {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3,
                 "loss": 0.25, "tags": ["a", "b"], "half": torch.ones(3, dtype=torch.bfloat16)}
        path = os.path.join(self.tmp, "ckpt.safetensors")
        fullburn.save_async(state, path).wait()
        back = fullburn.load(path)
        self.assertEqual(back["epoch"], 3)
        self.assertEqual(back["tags"], ["a", "b"])
        self.assertEqual(back["half"].dtype, torch.bfloat16)
        restored, ropt = self.model_and_optimizer()
        restored.load_state_dict(back["model"])
        ropt.load_state_dict(back["optim"])  # integer keys of its state survive
        for a, b in zip(restored.parameters(), model.parameters()):
            self.assertTrue(torch.equal(a, b))
        self.assertEqual(ropt.state_dict()["param_groups"], opt.state_dict()["param_groups"])

    def test_the_loop_may_change_its_tensors_once_save_async_returns(self):
        t = torch.arange(1 << 20, dtype=torch.float32)
        path = os.path.join(self.tmp, "t.safetensors")
        handle = fullburn.save_async({"t": t}, path)
        t.zero_()  # the next optimizer step
        handle.wait()
        self.assertTrue(torch.equal(fullburn.load(path)["t"], torch.arange(1 << 20, dtype=torch.float32)))

    def test_a_damaged_file_is_refused_with_its_reason(self):
        path = os.path.join(self.tmp, "d.safetensors")
        fullburn.save_async({"w": torch.randn(1000)}, path).wait()
        with open(path, "r+b") as f:
            f.seek(-10, os.SEEK_END)
            f.write(b"\x00" * 4)
        with self.assertRaisesRegex(fullburn.DataError, "checksum mismatch"):
            fullburn.load(path)
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(size // 2)
        with self.assertRaisesRegex(fullburn.DataError, "unusable"):
            fullburn.load(path)
        with self.assertRaises(FileNotFoundError):
            fullburn.load(os.path.join(self.tmp, "none"))

    def test_a_folder_that_cannot_be_written_fails_the_wait_and_keeps_the_old_file(self):
        if os.geteuid() == 0:
            self.skipTest("root writes into read-only folders; the disk-full case is below")
        path = os.path.join(self.tmp, "keep.safetensors")
        fullburn.save_async({"w": torch.ones(4)}, path).wait()
        os.chmod(self.tmp, stat.S_IRUSR | stat.S_IXUSR)
        with self.assertRaises(OSError):
            fullburn.save_async({"w": torch.zeros(4)}, path).wait()
        os.chmod(self.tmp, stat.S_IRWXU)
        self.assertTrue(torch.equal(fullburn.load(path)["w"], torch.ones(4)))

    def test_a_full_disk_fails_the_wait_and_keeps_the_old_file(self):
        # RLIMIT_FSIZE stands in for a full disk: the write fails part way.
        path = os.path.join(self.tmp, "full.safetensors")
        code = (
            "import resource, signal, sys, torch, fullburn\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "fullburn.save_async({'w': torch.ones(10)}, sys.argv[1]).wait()\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
            "try:\n"
            "    fullburn.save_async({'w': torch.zeros(100000)}, sys.argv[1]).wait()\n"
            "except OSError as e:\n"
            "    print('OSError', e)\n")
        out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("OSError", out.stdout)
        self.assertIn("untouched", out.stdout)
        self.assertEqual(out.stdout.count("\n"), 1)
        self.assertTrue(torch.equal(fullburn.load(path)["w"], torch.ones(10)))
        self.assertEqual([n for n in os.listdir(self.tmp) if ".tmp." in n], [])

    def test_kill_9_during_a_write_leaves_the_previous_file_whole(self):
        path = os.path.join(self.tmp, "k.safetensors")
        code = (
            "import sys, time, torch, fullburn\n"
            "fullburn.save_async({'w': torch.full((1000,), 1.0)}, sys.argv[1]).wait()\n"
            "print('first', flush=True)\n"
            "h = fullburn.save_async({'w': torch.full((64 << 20,), 2.0)}, sys.argv[1])\n"
            "print('second', flush=True)\n"
            "time.sleep(60)\n")
        p = subprocess.Popen([sys.executable, "-c", code, path], stdout=subprocess.PIPE, text=True)
        self.assertEqual(p.stdout.readline().strip(), "first")
        self.assertEqual(p.stdout.readline().strip(), "second")
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        w = fullburn.load(path)["w"]  # whole, whichever it is
        self.assertIn(float(w[0]), (1.0, 2.0))
        self.assertEqual(w.numel(), 1000 if float(w[0]) == 1.0 else 64 << 20)
        self.assertTrue(bool((w == w[0]).all()))

    def test_a_fullburn_train_checkpoint_loads_too(self):
        train = os.path.join(os.path.dirname(os.environ["FULLBURN_BIN"]), "fullburn-train")
        if not os.path.exists(train):
            self.skipTest("built without the training half")
        store = os.path.join(self.tmp, "runs.db")
        subprocess.run([os.environ["FULLBURN_BIN"], "train", "--store", store, "-q",
                        "model.name=mlp", "data.source=synthetic", "train.steps=2"],
                       check=True, capture_output=True, env=dict(os.environ, FULLBURN_TRAIN_DEVICE="cpu"))
        found = [os.path.join(d, f) for d, _, fs in os.walk(self.tmp) for f in fs
                 if f.endswith(".safetensors")]
        self.assertTrue(found)
        back = fullburn.load(found[0])
        self.assertTrue(any(k.startswith("model.") for k in back), list(back))


if __name__ == "__main__":
    unittest.main()
