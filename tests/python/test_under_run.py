"""fullburn.ImageLoader in jobs under the real `fullburn run`: its data wait
and loader events reach the run store with no code of the job's own, and
`fullburn tune`'s swap trial ({"loader": "fullburn"} in FULLBURN_TUNE_SET)
reads an ImageFolder DataLoader with it when, and only when, it reproduces
the DataLoader's transforms."""
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import unittest

FULLBURN = os.environ["FULLBURN_BIN"]

SWAP_SCRIPT = r"""
import sys, torch, torchvision
from torchvision import transforms
torch.manual_seed(0)
extra = [transforms.ColorJitter(0.1)] if sys.argv[2] == "jitter" else []
tf = transforms.Compose([transforms.RandomResizedCrop(32), transforms.RandomHorizontalFlip()] + extra +
                        [transforms.ToTensor(), transforms.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25])])
dataset = torchvision.datasets.ImageFolder(sys.argv[1], tf)
loader = torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=True, drop_last=True)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
it = iter(loader)
print("iterator", type(it).__name__, flush=True)
for x, y in it:
    assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float32, x.shape
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
"""

FULLBURN_LOOP = r"""
import sys, time, torch, fullburn
loader = fullburn.ImageLoader(sys.argv[1], 4, crop=32, threads=1)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(2):
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        time.sleep(0.01)
"""


# word_language_model's shape: an LSTM fed [sequence, batch] slices of one
# token tensor, parameters updated by hand (no optimizer, no DataLoader).
# argv[2]: "seq" for torch's default sequence-first layout, "batch" for
# batch_first=True with the same 20 sequences of 35 tokens.
SEQUENCE_LOOP = r"""
import sys, torch, torch.nn as nn
torch.manual_seed(0)
batch_first = sys.argv[2] == "batch"
data = torch.randint(0, 50, (20, 35 * 6 + 1))
class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.rnn, self.out = nn.Embedding(50, 16), nn.LSTM(16, 16, batch_first=batch_first), nn.Linear(16, 50)
    def forward(self, x):
        return self.out(self.rnn(self.emb(x))[0]).reshape(-1, 50)
model = LM()
for i in range(0, 35 * 6, 35):
    x, y = data[:, i:i + 35], data[:, i + 1:i + 36]
    if not batch_first:
        x, y = x.t().contiguous(), y.t().contiguous()
    model.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y.reshape(-1))
    loss.backward()
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-0.1)
"""


class UnderRun(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="fb_pyrun_")
        cls.root = os.path.join(cls.tmp, "imgs")
        subprocess.run([FULLBURN, "make-dataset", "images", cls.root, "--classes", "3",
                        "--per-class", "10", "--size", "64x48"], check=True, capture_output=True)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_job(self, code, *args, env=None):
        script = os.path.join(self.tmp, "job.py")
        with open(script, "w") as f:
            f.write(code)
        store = os.path.join(self.tmp, "runs-%d.db" % len(os.listdir(self.tmp)))
        self.last_store = store
        out = subprocess.run([FULLBURN, "run", "-q", "--store", store, "--", sys.executable, script,
                              self.root] + list(args), capture_output=True, text=True,
                             env=dict(os.environ, **(env or {})), timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        db = sqlite3.connect(store)
        events = [(kind, json.loads(data)) for kind, data in db.execute(
            "SELECT kind, data FROM events ORDER BY t")]
        steps = db.execute("SELECT data_wait_s FROM steps ORDER BY step").fetchall()
        db.close()
        return out, events, steps

    def test_an_image_loader_job_gets_its_data_wait_and_loader_events(self):
        out, events, steps = self.run_job(FULLBURN_LOOP)
        self.assertEqual(len(steps), 14)  # 2 epochs of 7 batches, one optimizer step each
        self.assertTrue(all(w is not None and w >= 0 for (w,) in steps), steps)
        loaders = [d for kind, d in events if kind == "loader"]
        self.assertGreaterEqual(len(loaders), 2)  # one at each epoch's end at least
        self.assertEqual(loaders[-1]["python"], "fullburn.ImageLoader")
        self.assertEqual(loaders[-1]["threads"], 1)
        self.assertGreater(loaders[-1]["decode_s"], 0)

    def test_a_sequence_first_batch_counts_its_sequences(self):
        for layout in ("seq", "batch"):
            out, events, steps = self.run_job(SEQUENCE_LOOP, layout)
            db = sqlite3.connect(self.last_store)
            samples = [n for (n,) in db.execute("SELECT samples FROM steps ORDER BY step")]
            db.close()
            # 6 updates by hand; the last is written at exit.
            self.assertEqual(samples, [20] * 6, (layout, out.stderr))

    def test_the_swap_trial_reads_an_image_folder_with_fullburn(self):
        out, events, steps = self.run_job(SWAP_SCRIPT, "plain",
                                          env={"FULLBURN_TUNE_SET": '{"loader": "fullburn"}'})
        self.assertIn("iterator _ImageIterator", out.stdout)
        described = [d for kind, d in events if kind == "dataloader"]
        self.assertEqual(described[0]["dataset"], "ImageFolder")
        self.assertEqual(described[0]["swapped"], "fullburn.ImageLoader")
        self.assertEqual(len(steps), 7)

    def test_a_transform_it_cannot_reproduce_runs_as_written(self):
        out, events, steps = self.run_job(SWAP_SCRIPT, "jitter",
                                          env={"FULLBURN_TUNE_SET": '{"loader": "fullburn"}'})
        self.assertIn("iterator _SingleProcessDataLoaderIter", out.stdout)
        self.assertIn("cannot stand in for this DataLoader", out.stderr)
        self.assertIn("ColorJitter", out.stderr)
        described = [d for kind, d in events if kind == "dataloader"]
        self.assertNotIn("swapped", described[0])


if __name__ == "__main__":
    unittest.main()


class TorchVersions(unittest.TestCase):
    """The step hooks say once when torch is outside the versions they are
    tested with (python/fullburn_autosteps/torch_hooks.py), and stay quiet inside."""

    def setUp(self):
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, os.path.join(here, "..", "..", "python"))
        import fullburn_autosteps
        self.untested = fullburn_autosteps.untested_torch

    def test_the_tested_range_is_quiet(self):
        for version in ("1.13.0a0", "1.13.1", "2.0.1", "2.11.0+cu130", "2.11.0"):
            self.assertIsNone(self.untested(version), version)

    def test_outside_it_one_line_names_the_range(self):
        for version in ("1.12.1", "2.12.0", "3.0.0.dev20270101", "unknown"):
            line = self.untested(version)
            self.assertEqual(line, "fullburn: PyTorch %s is outside the versions the step hooks "
                             "are tested with (1.13 to 2.11): steps are timed where its hooks "
                             "allow; check the step count in the summary\n" % version)
