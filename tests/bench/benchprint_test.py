#!/usr/bin/env python3
"""bench/benchprint.py (issue 65), the one printer of the bench scripts: a small
table as markdown, csv and json (values, a `|` and a comma escaped, the
header), several tables, ratio(), --format, and every Python bench script
printing through it. Standard library only:

  python3 tests/bench/benchprint_test.py [-v]
"""
import argparse, contextlib, csv, io, json, os, sys, unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench")
sys.dont_write_bytecode = True  # no bench/__pycache__ in the tree
sys.path.insert(0, BENCH)
import benchprint  # noqa: E402

# Python scripts under bench/ that print no result table of their own.
NOT_TABLES = {
    "gpu_results": "a tool over bench/results/gpu.jsonl, its csv/json shape tested by gpu_results_test.py",
    "gpu_traces": "writes trace files for tests/analyze/fixtures",
    "torch_gpu_baseline": "one JSON line per run, read by bench/gpu_results from-stage baseline",
}


def small():
    t = benchprint.Table([("name", "loader"), ("rate", "samples/s", "%.1f"), ("ratio", "x torch", benchprint.ratio),
                          ("ms", "ms", "%.2f", "right"), ("note", None)],
                         title="2 cores, batch 64", meta={"cores": 2})
    t.add(name="fullburn | ImageLoader", rate=1234.56, ratio=4.321, ms=1.5, note="fast, steady")
    t.add({"name": "torch, DataLoader", "rate": 285.0, "ratio": 1.0}, ms=None, extra=[1, 2])
    t.add(name="libtorch", rate=float("nan"), ratio=0.0, ms=2.0, md={"rate": "failed"})
    t.note("fullburn / torch: %s (goal >= 4x)" % benchprint.ratio(4.321), fullburn_vs_torch=4.321)
    return t


class Markdown(unittest.TestCase):
    def test_title_header_rows_and_notes(self):
        self.assertEqual(small().markdown(), "\n".join([
            "2 cores, batch 64",
            "",
            "| loader | samples/s | x torch | ms |",
            "|---|---|---|---:|",
            "| fullburn \\| ImageLoader | 1234.6 | 4.32x | 1.50 |",
            "| torch, DataLoader | 285.0 | 1.00x | - |",
            "| libtorch | failed | 0.00x | 2.00 |",
            "",
            "fullburn / torch: 4.32x (goal >= 4x)"]))

    def test_a_table_without_columns_is_its_title_and_notes(self):
        t = benchprint.Table(title="# head").note("one").note("two")
        self.assertEqual(t.markdown(), "# head\n\none\ntwo")
        self.assertEqual(t.csv(), "")

    def test_record_is_measure_and_value(self):
        t = benchprint.record({"speedup": 1.23456, "trials": 4}, fmt=lambda v: "%.3g" % v)
        self.assertEqual(t.markdown(), "| measure | value |\n|---|---|\n| speedup | 1.23 |\n| trials | 4 |")

    def test_missing_can_be_empty(self):
        t = benchprint.Table(["a", "b"], missing="").add(a=1)
        self.assertEqual(t.markdown().splitlines()[-1], "| 1 |  |")


class Csv(unittest.TestCase):
    def test_header_is_the_keys_and_values_are_raw(self):
        text = small().csv()
        rows = list(csv.reader(io.StringIO(text)))
        self.assertEqual(rows[0], ["name", "rate", "ratio", "ms", "note"])  # the csv-only column too
        self.assertEqual(rows[1], ["fullburn | ImageLoader", "1234.56", "4.321", "1.5", "fast, steady"])
        self.assertEqual(rows[2], ["torch, DataLoader", "285.0", "1.0", "", ""])
        self.assertEqual(len(rows), 4)
        self.assertIn('"torch, DataLoader"', text)  # the comma quoted, not a new field
        self.assertNotIn("\n\n", text)

    def test_lists_and_bools_are_json(self):
        t = benchprint.Table(["a", "b"]).add(a=[1.5, 2], b=True)
        self.assertEqual(t.csv(), 'a,b\n"[1.5, 2]",true')


class Json(unittest.TestCase):
    def test_one_object_with_title_meta_rows_summary(self):
        text = small().json()
        self.assertEqual(len(text.splitlines()), 1)
        doc = json.loads(text)
        self.assertEqual(doc["title"], "2 cores, batch 64")
        self.assertEqual(doc["meta"], {"cores": 2})
        self.assertEqual(doc["summary"], {"fullburn_vs_torch": 4.321})
        self.assertEqual(doc["rows"][0], {"name": "fullburn | ImageLoader", "rate": 1234.56, "ratio": 4.321,
                                          "ms": 1.5, "note": "fast, steady"})
        self.assertEqual(doc["rows"][1]["extra"], [1, 2])  # every key, shown or not
        self.assertIsNone(doc["rows"][2]["rate"])  # NaN is null: the text stays JSON
        self.assertNotIn("NaN", text)


class SeveralTables(unittest.TestCase):
    def test_blank_line_between_in_md_and_csv_json_lines(self):
        a, b = benchprint.Table(["x"]).add(x=1), benchprint.Table(["y"]).add(y=2)
        self.assertEqual(benchprint.render("md", a, b), "| x |\n|---|\n| 1 |\n\n| y |\n|---|\n| 2 |")
        self.assertEqual(benchprint.render("csv", a, benchprint.Table(title="t"), b), "x\n1\n\ny\n2")
        lines = benchprint.render("json", a, b).splitlines()
        self.assertEqual([json.loads(l)["rows"] for l in lines], [[{"x": 1}], [{"y": 2}]])

    def test_emit_prints_and_skips_nothing_to_print(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            benchprint.emit("csv", benchprint.Table(title="only a title"))
            benchprint.emit("md", benchprint.Table(["x"]).add(x=1))
        self.assertEqual(out.getvalue(), "| x |\n|---|\n| 1 |\n")


class Ratio(unittest.TestCase):
    def test_ratio(self):
        self.assertEqual(benchprint.ratio(2.134), "2.13x")
        self.assertEqual(benchprint.ratio(600, 281), "2.14x")
        self.assertEqual(benchprint.ratio(21.04, digits=1), "21.0x")
        for undefined in ((1, 0), (None,), (float("nan"),), (None, 2)):
            self.assertEqual(benchprint.ratio(*undefined), "-", undefined)


class FormatArgument(unittest.TestCase):
    def parser(self):
        p = argparse.ArgumentParser()
        benchprint.add_format_argument(p)
        return p

    def test_md_by_default_csv_and_json_on_request(self):
        p = self.parser()
        self.assertEqual(p.parse_args([]).format, "md")
        self.assertEqual(p.parse_args(["--format", "csv"]).format, "csv")
        self.assertEqual(p.parse_args(["--format=json"]).format, "json")
        for fmt in benchprint.FORMATS:
            self.assertIsInstance(small().render(fmt), str)

    def test_another_format_is_refused(self):
        with contextlib.redirect_stderr(io.StringIO()) as err, self.assertRaises(SystemExit):
            self.parser().parse_args(["--format", "xml"])
        self.assertIn("invalid choice", err.getvalue())

    def test_every_python_bench_script_prints_through_it(self):
        scripts = []
        for name in sorted(os.listdir(BENCH)):
            path = os.path.join(BENCH, name)
            if not os.path.isfile(path) or "." in name:
                continue
            with open(path) as f:
                text = f.read()
            if not text.startswith("#!") or "python" not in text.splitlines()[0] or name in NOT_TABLES:
                continue
            scripts.append(name)
            self.assertIn("benchprint.add_format_argument(", text, name)
            self.assertIn("benchprint.emit(", text, name)
        self.assertGreaterEqual(len(scripts), 20, scripts)


if __name__ == "__main__":
    unittest.main()
