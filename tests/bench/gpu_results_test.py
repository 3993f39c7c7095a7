#!/usr/bin/env python3
"""bench/gpu_results and bench/results/gpu.jsonl (issue 55): the committed rows
validate; a damaged file fails with the line number; add then table gives
fullburn / baseline; a stage's output turns into rows; bench/gpu_session's
row helpers write valid rows. Standard library only:

  python3 tests/bench/gpu_results_test.py [-v]
"""
import importlib.machinery, importlib.util, json, os, subprocess, sys, tempfile, unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "gpu_results")
ROWS = os.path.join(ROOT, "bench", "results", "gpu.jsonl")
SESSION = os.path.join(ROOT, "bench", "gpu_session")


def run(*args, stdin=None):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, input=stdin,
                          cwd=ROOT, timeout=60)


def read(path):
    """The rows of path, parsed."""
    with open(path) as f:
        return [json.loads(line) for line in f]


def good(**kw):
    row = {"date": "2026-11-27", "machine": "H200", "workload": "gpt2-124m", "system": "fullburn",
           "setting": "default", "metric": "tokens_per_s", "value": 284899}
    row.update(kw)
    return json.dumps(row)


class Committed(unittest.TestCase):
    def test_the_committed_rows_pass_check(self):
        p = run("check")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stdout, r"\d+ rows, 3 dates .*2 machines \(H100, H200\)")

    def test_the_earlier_leases_are_all_there(self):
        rows = read(ROWS)
        self.assertEqual(sorted({(r["date"], r["machine"]) for r in rows}),
                         [("2026-11-25", "H100"), ("2026-11-26", "H200"), ("2026-11-27", "H200")])
        # docs/benchmarks.md's headline numbers, as the doc gives them
        want = {("2026-11-26", "gpt2-124m", "pytorch-compile", "tokens_per_s"): 460500,
                ("2026-11-27", "resnet50", "pytorch-eager", "img_per_s"): 4706,
                ("2026-11-25", "matmul-bf16-8192", "pytorch-eager", "tflops"): 774.1}
        for (d, w, s, m), v in want.items():
            self.assertIn(v, [r["value"] for r in rows if (r["date"], r["workload"], r["system"], r["metric"]) ==
                              (d, w, s, m)], (d, w, s, m))


class Damaged(unittest.TestCase):
    def check_fails(self, lines, line_no, words):
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write("\n".join(lines) + "\n")
        try:
            p = run("check", f.name)
        finally:
            os.unlink(f.name)
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertEqual(p.stdout, "")
        msg = p.stderr.strip()
        self.assertEqual(len(msg.splitlines()), 1, msg)
        self.assertIn(f"{f.name}:{line_no}: ", msg)
        self.assertIn(words, msg)

    def test_a_missing_field(self):
        row = json.loads(good())
        del row["metric"]
        self.check_fails([good(), good(), json.dumps(row)], 3, "missing field metric")

    def test_a_date_that_is_not_a_date(self):
        self.check_fails([good(), good(date="2026-02-30")], 2, "not a real date")
        self.check_fails([good(date="27.11.2026")], 1, "not a real date")

    def test_a_nan_value(self):
        self.check_fails([good(), good().replace("284899", "NaN")], 2, "not finite")
        self.check_fails([good(value=float("inf"))], 1, "not finite")

    def test_a_line_that_is_not_json(self):
        self.check_fails([good(), "{date: 2026-11-27"], 2, "not JSON")

    def test_wrong_types_and_vocabulary(self):
        self.check_fails([good(value="284899")], 1, "value is str")
        self.check_fails([good(value=True)], 1, "value is bool")
        self.check_fails([good(setting=None)], 1, "setting is NoneType")
        self.check_fails([good(system="pytorch")], 1, "system 'pytorch' is not one of")
        self.check_fails([good(metric="Tokens/s")], 1, "not snake_case")
        self.check_fails([good(setting="")], 1, "setting is empty")
        self.check_fails([good(lease=4)], 1, "unknown field lease")
        self.check_fails([good(), ""], 2, "empty line")

    def test_rows_out_of_date_order(self):
        self.check_fails([good(), good(date="2026-11-26")], 2, "date order")


class AddAndTable(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.file = os.path.join(self.dir.name, "results", "gpu.jsonl")

    def tearDown(self):
        self.dir.cleanup()

    def add(self, *extra, **kw):
        args = {"date": "2026-11-26", "machine": "H200", "workload": "gpt2-124m", "system": "fullburn",
                "setting": "default", "metric": "tokens_per_s", "value": "1"}
        args.update(kw)
        return run("add", "--file", self.file, *[x for k, v in args.items() for x in (f"--{k}", v)], *extra)

    def test_a_fullburn_row_and_a_compiled_one_give_their_ratio(self):
        self.assertEqual(self.add(value="284899", setting="model.pad_vocab=64").returncode, 0)
        self.assertEqual(self.add("--note", "fused AdamW, SDPA", system="pytorch-compile",
                                  value="460500").returncode, 0)
        self.assertEqual(self.add(workload="resnet50", metric="img_per_s", value="4619").returncode, 0)
        self.assertEqual(run("check", self.file).returncode, 0)
        rows = read(self.file)
        self.assertEqual(rows[0]["value"], 284899)
        self.assertIsInstance(rows[0]["value"], int)
        self.assertEqual(rows[1]["note"], "fused AdamW, SDPA")

        p = run("table", "--file", self.file, "--format", "json")
        self.assertEqual(p.returncode, 0, p.stderr)
        groups = json.loads(p.stdout)
        gpt = [g for g in groups if g["workload"] == "gpt2-124m"]
        self.assertEqual(len(gpt), 1)
        self.assertEqual([r["system"] for r in gpt[0]["rows"]], ["fullburn", "pytorch-compile"])
        self.assertEqual(len(gpt[0]["ratios"]), 1)
        ratio = gpt[0]["ratios"][0]
        self.assertEqual((ratio["fullburn_setting"], ratio["baseline_system"]),
                         ("model.pad_vocab=64", "pytorch-compile"))
        self.assertAlmostEqual(ratio["ratio"], 284899 / 460500, places=4)
        self.assertEqual([g["ratios"] for g in groups if g["workload"] == "resnet50"], [[]])  # no baseline

        md = run("table", "--file", self.file).stdout
        self.assertIn("| 2026-11-26 | H200 | gpt2-124m | tokens_per_s | fullburn | model.pad_vocab=64 | 284,899 |"
                      " 0.62x pytorch-compile |", md)
        csv = run("table", "--file", self.file, "--format", "csv", "--workload", "gpt2-124m").stdout.splitlines()
        self.assertEqual(csv[1], "2026-11-26,H200,gpt2-124m,tokens_per_s,fullburn,model.pad_vocab=64,284899,"
                                 "pytorch-compile,default,460500,0.6187")
        self.assertEqual(len(csv), 3)

    def test_ratios_stay_within_a_date_and_machine(self):
        self.add(value="100")
        self.add(system="pytorch-eager", machine="H100", value="50")
        self.add(system="pytorch-eager", date="2026-11-27", value="50")
        self.assertEqual([g["ratios"] for g in json.loads(run("table", "--file", self.file, "--format",
                                                              "json").stdout)], [[], [], []])

    def test_a_bad_row_is_not_appended(self):
        self.assertEqual(self.add(value="1").returncode, 0)
        for kw in ({"value": "nan"}, {"value": "fast"}, {"date": "2026-13-01"}, {"system": "tensorflow"},
                   {"date": "2026-11-25"}):  # the last one: before the file's last row
            p = self.add(**kw)
            self.assertEqual(p.returncode, 1, kw)
            self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
        self.assertEqual(len(read(self.file)), 1)


class FromStage(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.file = os.path.join(self.dir.name, "gpu.jsonl")

    def tearDown(self):
        self.dir.cleanup()

    def rows(self):
        self.assertEqual(run("check", self.file).returncode, 0)
        return {(r["workload"], r["system"], r["setting"], r["metric"]): r["value"] for r in read(self.file)}

    def test_baseline_lines(self):
        base = {"torch": "2.11.0+cu130", "device": "cuda", "gpu": "NVIDIA H200", "windows": 30, "spread": 0.01,
                "loss": 7.0, "sdpa_enabled": None}
        text = "\n".join([
            "PyTorch eager (data on the device):",
            json.dumps({**base, "model": "resnet50", "mode": "eager", "data": "device", "workers": 0, "batch": 256,
                        "img_per_s": 4706.26, "compile_s": 0.0, "peak_mem_gib": 20.5}),
            "GPU busy 56.9% over 60 samples",
            json.dumps({"model": "gpt2", "mode": "compile", "error": "torch 1.13 has no torch.compile"}),
            "GPU busy 1.0% over 5 samples",  # after a failed run: no row
            json.dumps({**base, "model": "gpt2", "mode": "compile", "data": "device", "workers": 0, "batch": 16,
                        "tokens_per_s": 460500.4, "compile_s": 27.93, "peak_mem_gib": 30.0}),
            json.dumps({**base, "model": "resnet50", "mode": "eager", "data": "/tmp/imgs", "workers": 16,
                        "batch": 256, "img_per_s": 2429.0, "compile_s": 0.0, "peak_mem_gib": None}),
        ])
        p = run("from-stage", "baseline", "-", "--file", self.file, "--date", "2026-11-27", stdin=text)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("skipped a baseline that failed", p.stderr)
        self.assertEqual(self.rows(), {
            ("resnet50", "pytorch-eager", "default", "img_per_s"): 4706.26,
            ("resnet50", "pytorch-eager", "default", "peak_gib"): 20.5,
            ("resnet50", "pytorch-eager", "default", "smi_gpu_util_pct"): 56.9,
            ("gpt2-124m", "pytorch-compile", "default", "tokens_per_s"): 460500.4,
            ("gpt2-124m", "pytorch-compile", "default", "compile_s"): 27.93,
            ("gpt2-124m", "pytorch-compile", "default", "peak_gib"): 30.0,
            ("resnet50-jpeg", "pytorch-eager", "num_workers=16 pin_memory=true", "img_per_s"): 2429.0,
        })
        self.assertEqual({r["machine"] for r in read(self.file)}, {"H200"})

    def test_gpu_train_json(self):
        path = os.path.join(self.dir.name, "gpu_train.json")
        with open(path, "w") as f:
            json.dump({"peak_tflops": 789.512, "measured_peak": True, "rows": [
                {"workload": "resnet50", "mode": "eager", "precision": "bf16", "samples_per_s": 4326.2},
                {"workload": "resnet50", "mode": "cuda_graph", "precision": "bf16", "error": "out of memory"},
                {"workload": "gpt2", "mode": "cuda_graph", "precision": "bf16", "samples_per_s": 192.0,
                 "tokens_per_s": 196608.0, "mfu": 0.18612}]}, f)
        p = run("from-stage", "gpu_train", path, "--file", self.file, "--machine", "H200")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.rows(), {
            ("matmul-bf16-8192", "pytorch-eager", "default", "tflops"): 789.51,
            ("resnet50", "fullburn", "train.cuda_graphs=false", "img_per_s"): 4326.2,
            ("gpt2-124m", "fullburn", "train.cuda_graphs=true", "samples_per_s"): 192.0,
            ("gpt2-124m", "fullburn", "train.cuda_graphs=true", "tokens_per_s"): 196608.0,
            ("gpt2-124m", "fullburn", "train.cuda_graphs=true", "mfu_pct"): 18.61,
        })

    def test_memory_lines(self):
        log = ("fullburn: gpt, 1557686400 parameters\n"
               "fullburn: memory per rank: predicted 24.6 GiB, measured peak 29.4 GiB (30.1 GiB reserved from"
               " the driver)\n")
        p = run("from-stage", "memory", "-", "--file", self.file, "--machine", "H200", "--workload", "gpt2-xl",
                "--setting", "model.checkpoint=blocks", stdin=log)
        self.assertEqual(p.returncode, 0, p.stderr)
        run("from-stage", "memory", "-", "--file", self.file, "--machine", "H200", "--workload", "gpt-64x2",
            "--setting", "default", stdin="fullburn: memory per rank: predicted 512.0 MiB, measured peak 1.5 GiB\n")
        self.assertEqual(self.rows(), {
            ("gpt2-xl", "fullburn", "model.checkpoint=blocks", "predicted_peak_gib"): 24.6,
            ("gpt2-xl", "fullburn", "model.checkpoint=blocks", "peak_gib"): 29.4,
            ("gpt2-xl", "fullburn", "model.checkpoint=blocks", "reserved_peak_gib"): 30.1,
            ("gpt-64x2", "fullburn", "default", "predicted_peak_gib"): 0.5,
            ("gpt-64x2", "fullburn", "default", "peak_gib"): 1.5,
        })

    def test_machine_names(self):
        loader = importlib.machinery.SourceFileLoader("gpu_results", SCRIPT)
        spec = importlib.util.spec_from_loader("gpu_results", loader)
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)
        for raw, short in (("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H200", "H200"),
                           ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA GH200 480GB", "GH200"),
                           ("Tesla T4", "T4"), ("NVIDIA L40S", "L40S"),
                           ("NVIDIA GeForce RTX 4090", "GeForce-RTX-4090")):
            self.assertEqual(mod.machine_name(raw), short)


class SessionHelpers(unittest.TestCase):
    """bench/gpu_session's row, memory_rows and col, as its stages call them."""

    def test_rows_from_the_stage_helpers(self):
        helpers = []
        with open(SESSION) as f:
            lines = iter(f)
            for line in lines:
                if line.startswith("today="):
                    helpers.append(line)
                    for line in lines:
                        helpers.append(line)
                        if line.startswith("col()"):
                            break
                    break
        self.assertTrue(helpers and helpers[-1].startswith("col()"), "bench/gpu_session's helpers moved")
        with tempfile.TemporaryDirectory() as d:
            script = "".join(helpers) + r"""
line='| model.pad_vocab=64 | 96 | 284899 | predicted 16.0 GiB, measured peak 16.0 GiB |'
row gpt2-124m model.pad_vocab=64 tokens_per_s "$(col 4 <<< "$line")"
echo 'predicted 16.0 GiB, measured peak 16.0 GiB' | memory_rows gpt2-124m model.pad_vocab=64
row resnet50 "" img_per_s 4619
row gpt2-xl model.checkpoint=blocks tokens_per_s 0      # no rate: no row
row gpt2-xl model.checkpoint=blocks last_loss nan       # not a number: no row
row gpt2-xl model.checkpoint=blocks tokens_per_s ""     # empty: no row
row gpt3-6.7b model.checkpoint=none fits 0
row gpt2-124m default tokens_per_s 1 bogus-system      # does not validate: said, the stage goes on
echo "still here"
"""
            p = subprocess.run(["bash", "-c", script, "gpu_session", "kernels"], capture_output=True, text=True,
                               cwd=ROOT, timeout=120, env={**os.environ, "MACHINE": "H200", "out": d})
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("still here", p.stdout)
            self.assertIn("bogus-system", p.stderr)
            path = os.path.join(d, "gpu.jsonl")
            self.assertEqual(run("check", path).returncode, 0)
            rows = read(path)
        self.assertEqual([(r["workload"], r["setting"], r["metric"], r["value"]) for r in rows], [
            ("gpt2-124m", "model.pad_vocab=64", "tokens_per_s", 284899),
            ("gpt2-124m", "model.pad_vocab=64", "predicted_peak_gib", 16.0),
            ("gpt2-124m", "model.pad_vocab=64", "peak_gib", 16.0),
            ("resnet50", "default", "img_per_s", 4619),
            ("gpt3-6.7b", "model.checkpoint=none", "fits", 0),
        ])
        self.assertEqual({(r["machine"], r["system"], r["source"]) for r in rows},
                         {("H200", "fullburn", "bench/gpu_session kernels")})


if __name__ == "__main__":
    unittest.main()
