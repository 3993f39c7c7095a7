"""python/fullburn_flops.py: one step's FLOPs, against hand counts of real
models on the CPU, and what a count that cannot be made says.

Run under Debian's PyTorch 1.13 (which has no FlopCounterMode: the counts
are skipped, the refusal is checked) and PyPI's 2.11 (the counts)."""
import json
import os
import sys
import tempfile
import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import fullburn_flops  # noqa: E402
import fullburn_markers  # noqa: E402


def counts():
    try:
        fullburn_flops.make_counter_class(torch)
        return True
    except RuntimeError:
        return False


class Block(nn.Module):
    """A GPT-2 block (pre-norm attention and a 4x MLP), attention written
    out as nanoGPT's slow path does, so every matmul is an aten mm/bmm."""

    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.out = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def attend(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (c // self.heads) ** 0.5
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, c))

    def forward(self, x):
        x = x + self.attend(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


@unittest.skipUnless(counts(), "this PyTorch has no per-op FlopCounterMode")
class HandCounts(unittest.TestCase):
    def test_a_linear_is_2mnk_forward_and_6mnk_with_its_backward(self):
        m, k, n = 64, 128, 256
        layer = nn.Linear(k, n)
        x = torch.randn(m, k, requires_grad=True)
        with torch.no_grad():
            forward = fullburn_flops.count_once(torch, layer, x)
        self.assertEqual(forward["flops"], 2 * m * n * k)
        both = fullburn_flops.count_once(torch, lambda: layer(x).sum().backward())
        self.assertEqual(both["flops"], 6 * m * n * k)  # grad of input and of weight
        self.assertEqual(both["by_dtype"], {"float32": 6 * m * n * k})
        self.assertEqual(both["device"], "cpu")
        self.assertEqual(both["uncounted"], [])

    def test_a_gpt2_block_is_6n_per_token_plus_attention(self):
        torch.manual_seed(0)
        b, t, c, heads = 2, 64, 128, 4
        block = Block(c, heads)
        x = torch.randn(b, t, c, requires_grad=True)  # a block in the middle: its input needs grad
        got = fullburn_flops.count_once(torch, lambda: block(x).sum().backward())["flops"]
        n = 12 * c * c  # its matmuls' weights (the biases and norms add no matmul FLOPs)
        expected = b * t * (6 * n + 12 * t * c)  # PaLM's 6N + 12·L·H·Q·T, L = 1
        self.assertLess(abs(got - expected) / expected, 0.05, (got, expected))

    def test_a_convolution_counts_2_k_c_r_s_per_output(self):
        conv = nn.Conv2d(3, 16, kernel_size=3, padding=1)
        x = torch.randn(4, 3, 32, 32)
        with torch.no_grad():
            got = fullburn_flops.count_once(torch, conv, x)
        self.assertEqual(got["flops"], 2 * 4 * 32 * 32 * 16 * 3 * 3 * 3)
        self.assertEqual(got["conv_by_dtype"], {"float32": got["flops"]})

    def test_autocast_puts_the_matmuls_in_bf16(self):
        layer = nn.Linear(128, 256)
        x = torch.randn(64, 128)

        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                layer(x).float().sum().backward()

        got = fullburn_flops.count_once(torch, step)
        self.assertEqual(set(got["by_dtype"]), {"bfloat16"}, got)

    def test_the_cpus_attention_kernel_is_counted_by_the_flash_formula(self):
        q, k, v = (torch.randn(2, 4, 64, 32, requires_grad=True) for _ in range(3))
        got = fullburn_flops.count_once(
            torch, lambda: F.scaled_dot_product_attention(q, k, v).sum().backward())
        self.assertEqual(got["uncounted"], [])
        forward = 4 * 2 * 4 * 64 * 64 * 32  # QK^T and AV, 2·T·T·D each per head
        self.assertEqual(got["flops"], forward * 7 // 2)  # the backward's 2.5x on top

    def test_an_op_without_a_formula_is_named_and_makes_a_lower_bound(self):
        lib = torch.library.Library("fbtest", "FRAGMENT")
        lib.define("mymm(Tensor a, Tensor b) -> Tensor")
        lib.impl("mymm", lambda a, b: a @ b, "CPU")
        a, b = torch.randn(32, 32), torch.randn(32, 32)
        got = fullburn_flops.count_once(torch, lambda: torch.ops.fbtest.mymm(a, b))
        self.assertIn("fbtest.mymm", got["uncounted"])
        self.assertTrue(got["lower_bound"])


class TheStepsEvent(unittest.TestCase):
    """FlopCount as the step hooks drive it, writing to a real events file."""

    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.events = os.path.join(self.dir, "events.jsonl")
        open(self.events, "w").close()
        os.environ[fullburn_markers.ENV_VAR] = self.events
        self.markers = fullburn_markers.Markers(_automatic=True)

    def tearDown(self):
        os.environ.pop(fullburn_markers.ENV_VAR, None)

    def written(self, name):
        with open(self.events) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        return [e for e in lines if e.get("kind") == "event" and e.get("name") == name]

    def run_steps(self, count, budget=0.0):
        layer = nn.Linear(32, 32)
        x = torch.randn(8, 32)
        for step in range(1, 5):
            layer(x).sum().backward()
            count.step_ended(step, self.markers, 0.01)

    @unittest.skipUnless(counts(), "this PyTorch has no per-op FlopCounterMode")
    def test_step_three_is_counted_once_with_its_cost(self):
        count = fullburn_flops.FlopCount(torch, step=3, budget=0.0)
        self.run_steps(count)
        flops = self.written("flops")
        self.assertEqual(len(flops), 1, flops)
        data = flops[0]["data"]
        self.assertEqual(data["step"], 3)
        self.assertEqual(data["flops"], 6 * 8 * 32 * 32 - 2 * 8 * 32 * 32)  # x needs no grad
        self.assertEqual(data["median_step_s"], 0.01)
        self.assertEqual(len(self.written("flops_setup")), 1)

    @unittest.skipUnless(counts(), "this PyTorch has no per-op FlopCounterMode")
    def test_a_count_past_its_budget_stops_and_says_so(self):
        # A budget of 1e-9 medians has passed before the first op runs.
        count = fullburn_flops.FlopCount(torch, step=3, budget=1e-9)
        self.run_steps(count)
        data = self.written("flops")[0]["data"]
        self.assertNotIn("flops", data)
        self.assertIn("FULLBURN_FLOPS_BUDGET", data["error"])

    @unittest.skipIf(counts(), "this PyTorch counts")
    def test_a_pytorch_without_the_counter_says_why_once(self):
        count = fullburn_flops.FlopCount(torch, step=3, budget=2.0)
        self.run_steps(count)
        flops = self.written("flops")
        self.assertEqual(len(flops), 1)
        self.assertIn(torch.__version__, flops[0]["data"]["error"])
        self.assertIn("FlopCounterMode", flops[0]["data"]["error"])


if __name__ == "__main__":
    unittest.main()
