"""fullburn.ImageLoader and TokenLoader under Debian's /usr/bin/python3 and
torch 1.13: batches equal to the C++ loader's, the hand-off without a copy,
slots never reused under a live tensor, exact resume, shards, bad input.
Run by CTest (tests/python/CMakeLists.txt) with PYTHONPATH=BUILD/python,
FULLBURN_BIN and DUMP_BATCHES set."""
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import unittest

import numpy as np
import torch

import fullburn

FULLBURN = os.environ["FULLBURN_BIN"]
DUMP = os.environ["DUMP_BATCHES"]


def make_images(root, classes=3, per_class=10, size="64x48", seed=0):
    subprocess.run([FULLBURN, "make-dataset", "images", root, "--classes", str(classes),
                    "--per-class", str(per_class), "--size", size, "--seed", str(seed)],
                   check=True, capture_output=True)


class Data(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="fb_py_")
        cls.root = os.path.join(cls.tmp, "imgs")
        make_images(cls.root)  # 30 images, 3 classes

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def collect(self, loader, epochs=1):
        out = []
        for _ in range(epochs):
            it = iter(loader)
            for x, y in it:
                out.append((x.clone(), y.clone(), it.last_samples.copy()))
        return out


class SameAsTheCppLoader(Data):
    def cpp_batches(self, batch, crop, seed, epoch, train, channels_last, count):
        out = os.path.join(self.tmp, "dump.bin")
        subprocess.run([DUMP, self.root, str(batch), str(crop), str(seed), str(epoch),
                        str(int(train)), str(int(channels_last)), str(count), out], check=True)
        data = open(out, "rb").read()
        per_image = crop * crop * 3
        batches, at = [], 0
        while at < len(data):
            images = np.frombuffer(data, np.uint8, batch * per_image, at)
            at += batch * per_image
            labels = np.frombuffer(data, np.int32, batch, at)
            at += batch * 4
            shape = (batch, crop, crop, 3) if channels_last else (batch, 3, crop, crop)
            batches.append((images.reshape(shape), labels))
        return batches

    def test_uint8_batches_equal_the_cpp_loaders_for_the_same_seed(self):
        for train, channels_last in ((True, False), (True, True), (False, False)):
            with self.subTest(train=train, channels_last=channels_last):
                expected = self.cpp_batches(4, 32, 7, 1, train, channels_last, 5)
                loader = fullburn.ImageLoader(self.root, 4, train=train, crop=32, seed=7,
                                              threads=3, dtype=torch.uint8,
                                              channels_last=channels_last)
                loader.set_epoch(1)
                got = list(loader)[:5]
                self.assertEqual(len(got), len(expected))
                for (x, y), (ex, ey) in zip(got, expected):
                    self.assertEqual(x.dtype, torch.uint8)
                    self.assertEqual(tuple(x.shape), (4, 3, 32, 32))  # NCHW either way
                    if channels_last:
                        self.assertTrue(x.is_contiguous(memory_format=torch.channels_last))
                        x = x.permute(0, 2, 3, 1)
                    self.assertTrue(np.array_equal(x.numpy(), ex))
                    self.assertTrue(np.array_equal(y.numpy(), ey.astype(np.int64)))

    def test_float_batches_are_the_uint8_ones_normalized(self):
        mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
        a = fullburn.ImageLoader(self.root, 5, crop=24, seed=3, dtype=torch.uint8)
        b = fullburn.ImageLoader(self.root, 5, crop=24, seed=3, mean=mean, std=std)
        for (xa, ya), (xb, yb) in zip(a, b):
            self.assertEqual(xb.dtype, torch.float32)
            ref = (xa.float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(
                std).view(1, 3, 1, 1)
            self.assertTrue(torch.allclose(xb, ref, atol=1e-5), (xb - ref).abs().max())
            self.assertTrue(torch.equal(ya, yb))


class HandOff(Data):
    def test_a_batch_is_the_loaders_memory_not_a_copy(self):
        loader = fullburn.ImageLoader(self.root, 4, crop=16)
        for x, _ in loader:
            blocks = loader._native.memory_blocks()
            self.assertIn(x.data_ptr(), blocks)

    def test_device_registration_covers_each_block_once_and_ends_before_it_is_freed(self):
        # The CUDA boundary (cudaHostRegister/Unregister) as recording hooks:
        # each block registered whole, once; every registration undone when
        # the pool goes (the loader and its last batch), so none outlives its
        # memory; a failed registration is an exception and is tried again.
        registered, unregistered = [], []
        loader = fullburn.ImageLoader(self.root, 4, crop=16, drop_last=False)
        native = loader._native
        native.set_device_hooks(lambda a, n: registered.append((a, n)),
                                lambda a, n: unregistered.append((a, n)))
        kept = []
        for _ in range(2):
            for x, _ in loader:
                self.assertTrue(native.register_block(x.data_ptr()))
                kept.append(x)
        blocks = native.memory_blocks()
        self.assertEqual(sorted(a for a, _ in registered), sorted(set(a for a, _ in registered)))
        self.assertEqual(set(a for a, _ in registered), set(x.data_ptr() for x in kept))
        self.assertTrue(all(n == 4 * 3 * 16 * 16 * 4 for _, n in registered), registered)
        self.assertEqual(native.registered_blocks(), len(registered))
        self.assertFalse(native.register_block(kept[0].data_ptr() + 64))
        self.assertLessEqual(len(registered), len(blocks))
        self.assertEqual(unregistered, [])
        del loader, native, x, kept
        import gc
        gc.collect()
        self.assertEqual(sorted(unregistered), sorted(registered))

        def refuse(a, n):
            raise RuntimeError("no room")
        loader = fullburn.ImageLoader(self.root, 4, crop=16)
        loader._native.set_device_hooks(refuse, lambda a, n: None)
        x, _ = next(iter(loader))
        with self.assertRaisesRegex(RuntimeError, "no room"):
            loader._native.register_block(x.data_ptr())
        self.assertEqual(loader._native.registered_blocks(), 0)
        loader._native.set_device_hooks(lambda a, n: None, lambda a, n: None)
        self.assertTrue(loader._native.register_block(x.data_ptr()))
        self.assertEqual(loader._native.registered_blocks(), 1)

    def test_a_kept_batch_is_never_overwritten(self):
        # With slots reused under a live tensor, batch 0's memory would hold a
        # later batch by the end of two epochs.
        loader = fullburn.ImageLoader(self.root, 3, crop=16, prefetch=1, threads=2)
        it = iter(loader)
        first, _ = next(it)
        snapshot = first.clone()
        for _ in range(2):
            for x, _ in it:
                x.mul_(0)  # the loop may write its batches: not the next ones
            it = iter(loader)
        self.assertTrue(torch.equal(first, snapshot))

    def test_keeping_every_batch_neither_deadlocks_nor_corrupts(self):
        # What happens instead: each kept batch keeps its own memory; the
        # loader takes new memory for the next and never waits for one.
        kept = []
        loader = fullburn.ImageLoader(self.root, 2, crop=16, prefetch=1, threads=2, seed=5)
        done = threading.Event()

        def run():
            for _ in range(3):
                for x, y in loader:
                    kept.append((x, y))
            done.set()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.assertTrue(done.wait(120), "the loader stopped while every batch was kept")
        again = fullburn.ImageLoader(self.root, 2, crop=16, seed=5)
        fresh = [b for _ in range(3) for b in self.collect(again)]
        self.assertEqual(len(kept), len(fresh))
        for (x, y), (fx, fy, _) in zip(kept, fresh):
            self.assertTrue(torch.equal(x, fx))
            self.assertTrue(torch.equal(y, fy))


class Resume(Data):
    def test_state_dict_resumes_the_rest_of_an_uninterrupted_run(self):
        def make():
            return fullburn.ImageLoader(self.root, 4, crop=16, seed=11, threads=2)

        whole = self.collect(make(), epochs=2)  # 7 batches an epoch
        first = make()
        it = iter(first)
        for _ in range(3):
            next(it)
        state = first.state_dict()
        self.assertEqual((state["epoch"], state["next_batch"]), (0, 3))
        resumed = make()
        resumed.load_state_dict(state)
        rest = self.collect(resumed, epochs=2)[: len(whole) - 3]
        self.assertEqual(len(rest), len(whole) - 3)
        for (x, y, s), (wx, wy, ws) in zip(rest, whole[3:]):
            self.assertTrue(np.array_equal(s, ws))
            self.assertTrue(torch.equal(x, wx))
            self.assertTrue(torch.equal(y, wy))

    def test_a_state_dict_of_another_dataset_or_seed_is_refused(self):
        a = fullburn.ImageLoader(self.root, 4, crop=16, seed=1)
        state = a.state_dict()
        with self.assertRaisesRegex(ValueError, "seed 1; this loader's is 2"):
            fullburn.ImageLoader(self.root, 4, crop=16, seed=2).load_state_dict(state)
        other = os.path.join(self.tmp, "other")
        make_images(other, classes=2, per_class=4)
        with self.assertRaisesRegex(ValueError, "a dataset of 30 images; this loader reads 8"):
            fullburn.ImageLoader(other, 4, crop=16, seed=1).load_state_dict(state)
        with self.assertRaisesRegex(ValueError, "not a fullburn.ImageLoader"):
            a.load_state_dict({"kind": "fullburn.TokenLoader"})


class Shards(Data):
    def test_two_ranks_read_disjoint_shards_that_cover_the_data(self):
        seen = []
        for rank in (0, 1):
            loader = fullburn.ImageLoader(self.root, 4, crop=16, train=False, rank=rank,
                                          world_size=2, drop_last=False)
            seen.append(np.concatenate([s for _, _, s in self.collect(loader)]))
        self.assertEqual(set(seen[0]) & set(seen[1]), set())
        self.assertEqual(sorted(np.concatenate(seen)), list(range(30)))

    def test_without_shuffle_an_evaluation_reads_in_order(self):
        loader = fullburn.ImageLoader(self.root, 7, crop=16, train=False, shuffle=False)
        order = np.concatenate([s for _, _, s in self.collect(loader)])
        self.assertEqual(list(order), list(range(30)))  # the last batch short (drop_last=False)
        self.assertEqual(len(loader), 5)


class BadInput(Data):
    def test_each_is_one_clear_exception(self):
        with self.assertRaisesRegex(FileNotFoundError, "no such folder or pack"):
            fullburn.ImageLoader(os.path.join(self.tmp, "missing"), 4)
        empty = os.path.join(self.tmp, "empty")
        os.makedirs(os.path.join(empty, "a"), exist_ok=True)
        with self.assertRaises(fullburn.DataError):
            fullburn.ImageLoader(empty, 4)
        with self.assertRaisesRegex(ValueError, "30 samples .* fewer than one batch of 64"):
            fullburn.ImageLoader(self.root, 64, drop_last=True)
        with self.assertRaisesRegex(ValueError, "on_bad_sample"):
            fullburn.ImageLoader(self.root, 4, on_bad_sample="ignore")
        if not torch.cuda.is_available():
            with self.assertRaisesRegex(RuntimeError, "sees no CUDA device"):
                fullburn.ImageLoader(self.root, 4, device="cuda")

    def test_argument_errors_quote_the_values_given(self):
        with self.assertRaisesRegex(ValueError, r"^batch_size must be at least 1, not 0$"):
            fullburn.ImageLoader(self.root, 0)
        with self.assertRaisesRegex(ValueError, r"^crop must be at least 1 pixel, not -3$"):
            fullburn.ImageLoader(self.root, 4, crop=-3)
        with self.assertRaisesRegex(ValueError, r"^rank 2 is not one of world_size 2's ranks$"):
            fullburn.ImageLoader(self.root, 4, rank=2, world_size=2)

    def test_a_bad_sample_is_named_by_its_path(self):
        root = os.path.join(self.tmp, "one_bad")
        make_images(root, classes=1, per_class=5)
        victim = os.path.join(root, "class_000", sorted(os.listdir(os.path.join(root, "class_000")))[2])
        with open(victim, "r+b") as f:
            f.truncate(0)
        strict = fullburn.ImageLoader(root, 2, crop=16, train=False, shuffle=False,
                                      on_bad_sample="fail")
        with self.assertRaises(fullburn.DataError) as e:
            list(strict)
        self.assertTrue(str(e.exception).startswith("bad sample " + victim + ": "), str(e.exception))

    def test_corrupt_images_are_skipped_and_counted_or_named(self):
        root = os.path.join(self.tmp, "bad")
        make_images(root, classes=2, per_class=6)
        victim = sorted(os.listdir(os.path.join(root, "class_000")))[0]
        path = os.path.join(root, "class_000", victim)
        with open(path, "r+b") as f:
            f.truncate(100)  # a truncated JPEG
        with open(os.path.join(root, "class_001", "zz_not_an_image.jpg"), "wb") as f:
            f.write(b"this is not a JPEG")
        loader = fullburn.ImageLoader(root, 4, crop=16, train=False, shuffle=False)
        count = sum(x.shape[0] for x, _ in loader)
        self.assertEqual(count, 13)  # 13 files, each bad one replaced by the next good sample
        self.assertGreaterEqual(loader.stats()["skipped"], 2)
        strict = fullburn.ImageLoader(root, 4, crop=16, train=False, shuffle=False,
                                      on_bad_sample="fail")
        with self.assertRaises(fullburn.DataError) as e:
            list(strict)
        self.assertIn("bad sample", str(e.exception))
        self.assertIn(root, str(e.exception))
        self.assertEqual(str(e.exception).count("\n"), 0)


class Stats(Data):
    def test_stats_say_what_the_loader_did(self):
        loader = fullburn.ImageLoader(self.root, 5, crop=16, threads=2)
        n = sum(1 for _ in loader)
        s = loader.stats()
        self.assertEqual(s["batches"], n)
        self.assertEqual(s["samples"], 5 * n)
        self.assertGreater(s["decode_s"], 0)
        self.assertGreaterEqual(s["data_wait_s"], 0)
        self.assertEqual(s["threads"], 2)


@unittest.skipUnless(torch.cuda.is_available(), "the GPU tier: needs CUDA torch and a GPU")
class Cuda(Data):
    """device="cuda" against the CPU reference (not in CTest's list: CI has no
    GPU; bench/gpu_session python runs it on the GPU machine)."""

    def test_device_batches_equal_the_host_ones(self):
        for kw in ({}, {"channels_last": True}, {"dtype": torch.bfloat16}):
            host = fullburn.ImageLoader(self.root, 4, crop=24, seed=5, **kw)
            dev = fullburn.ImageLoader(self.root, 4, crop=24, seed=5, device="cuda", **kw)
            pairs = 0
            for (xh, yh), (xd, yd) in zip(host, dev):
                self.assertEqual(xd.device.type, "cuda")
                self.assertEqual(xd.dtype, xh.dtype)
                self.assertEqual(xd.shape, xh.shape)
                self.assertEqual(xd.is_contiguous(memory_format=torch.channels_last),
                                 xh.is_contiguous(memory_format=torch.channels_last))
                tol = 2e-2 if xh.dtype == torch.bfloat16 else 1e-5
                diff = (xd.float().cpu() - xh.float()).abs().max().item()
                self.assertLessEqual(diff, tol, (kw, pairs))
                self.assertTrue(torch.equal(yd.cpu(), yh), kw)
                pairs += 1
            self.assertEqual(pairs, len(host))

    def test_a_kept_device_batch_is_never_overwritten(self):
        # The host slot goes back to the loader only once its copy is done; a
        # slot reused early would show in batch 0 by the end of two epochs.
        loader = fullburn.ImageLoader(self.root, 3, crop=16, prefetch=1, threads=2, device="cuda")
        it = iter(loader)
        first, _ = next(it)
        snapshot = first.clone()
        for _ in range(2):
            for x, _ in it:
                x.mul_(0)
            it = iter(loader)
        torch.cuda.synchronize()
        self.assertTrue(torch.equal(first, snapshot))


class Tokens(unittest.TestCase):
    def test_windows_are_the_files_tokens_shifted_by_one(self):
        tmp = tempfile.mkdtemp(prefix="fb_tok_")
        try:
            path = os.path.join(tmp, "t.bin")
            np.arange(5000, dtype=np.uint16).tofile(path)  # token i == position i
            loader = fullburn.TokenLoader(path, 4, 16, seed=3)
            self.assertEqual(len(loader), 5000 // 64)
            batches = list(loader)
            self.assertEqual(len(batches), len(loader))
            for x, y in batches:
                self.assertEqual(x.dtype, torch.int64)
                self.assertTrue(torch.equal(y, x + 1))  # the next token
                self.assertTrue(torch.equal(x[:, 1:], x[:, :-1] + 1))  # one window each
            # Ranks read other windows; a resume continues exactly.
            r0 = list(fullburn.TokenLoader(path, 4, 16, seed=3, rank=0, world_size=2))
            r1 = list(fullburn.TokenLoader(path, 4, 16, seed=3, rank=1, world_size=2))
            self.assertFalse(torch.equal(r0[0][0], r1[0][0]))
            a = fullburn.TokenLoader(path, 4, 16, seed=3)
            it = iter(a)
            for _ in range(5):
                next(it)
            b = fullburn.TokenLoader(path, 4, 16, seed=3)
            b.load_state_dict(a.state_dict())
            self.assertTrue(torch.equal(next(iter(b))[0], batches[5][0]))
            with self.assertRaisesRegex(FileNotFoundError, "no such token file"):
                fullburn.TokenLoader(os.path.join(tmp, "none.bin"), 4, 16)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class NumpyOutput(Data):
    def test_numpy_batches_equal_the_torch_ones_without_torch_imported(self):
        want = [(x.numpy().copy(), y.numpy().copy())
                for x, y in fullburn.ImageLoader(self.root, 8, crop=32, seed=5, threads=2)]
        uint8 = [x.numpy().copy() for x, _ in
                 fullburn.ImageLoader(self.root, 8, crop=32, seed=5, threads=2, dtype=torch.uint8,
                                      channels_last=True)]
        # In a child whose torch cannot be imported: output="numpy" must not need it.
        code = ("import sys, numpy as np; sys.modules['torch'] = None\n"
                "import fullburn\n"
                "out = {}\n"
                "for i, (x, y) in enumerate(fullburn.ImageLoader(sys.argv[1], 8, crop=32, seed=5, "
                "threads=2, output='numpy')):\n"
                "    out['x%d' % i], out['y%d' % i] = x.copy(), y.copy()\n"
                "for i, (x, _) in enumerate(fullburn.ImageLoader(sys.argv[1], 8, crop=32, seed=5, "
                "threads=2, output='numpy', dtype=np.uint8, channels_last=True)):\n"
                "    out['u%d' % i] = x.copy()\n"
                "np.savez(sys.argv[2], **out)\n")
        path = os.path.join(self.tmp, "numpy_batches.npz")
        run = subprocess.run([sys.executable, "-c", code, self.root, path], capture_output=True,
                             text=True, env=os.environ)
        self.assertEqual(run.returncode, 0, run.stderr)
        got = np.load(path)
        self.assertEqual(len(got.files), 3 * len(want))
        for i, (x, y) in enumerate(want):
            self.assertEqual(got["x%d" % i].shape, x.shape)  # [B, 3, crop, crop]
            self.assertEqual(got["x%d" % i].dtype, np.float32)
            np.testing.assert_array_equal(got["x%d" % i], x)
            np.testing.assert_array_equal(got["y%d" % i], y)
            np.testing.assert_array_equal(got["u%d" % i], uint8[i])  # channels_last: NCHW view

    def test_numpy_output_refuses_what_it_cannot_make(self):
        with self.assertRaisesRegex(ValueError, "output must be 'torch' or 'numpy'"):
            fullburn.ImageLoader(self.root, 8, output="jax")
        with self.assertRaisesRegex(ValueError, "needs output='torch'"):
            fullburn.ImageLoader(self.root, 8, output="numpy", device="cuda")
        with self.assertRaisesRegex(ValueError, "float32 or uint8 batches, not float16"):
            fullburn.ImageLoader(self.root, 8, output="numpy", dtype=np.float16)

    def test_token_batches_as_numpy(self):
        path = os.path.join(self.tmp, "tokens.bin")
        np.arange(3000, dtype=np.uint16).tofile(path)
        for (x, y), (tx, ty) in zip(fullburn.TokenLoader(path, 2, 16, seed=1, output="numpy"),
                                    fullburn.TokenLoader(path, 2, 16, seed=1)):
            self.assertIsInstance(x, np.ndarray)
            np.testing.assert_array_equal(x, tx.numpy())
            np.testing.assert_array_equal(y, x + 1)


class WithoutTorch(unittest.TestCase):
    def test_the_module_imports_and_says_what_needs_torch(self):
        code = ("import sys; sys.modules['torch'] = None\n"
                "import fullburn\n"
                "print(fullburn.__version__)\n"
                "try:\n"
                "    fullburn.save_async({}, '/tmp/x')\n"
                "except ImportError as e:\n"
                "    print('ERR', e)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=os.environ)
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.splitlines()
        self.assertRegex(lines[0], r"^\d+\.\d+\.\d+$")
        self.assertIn("needs PyTorch", lines[1])


if __name__ == "__main__":
    unittest.main()
