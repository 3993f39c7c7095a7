"""fullburn's runs in the trackers teams use, read back with the trackers' own
code (docs/trackers.md): TensorBoard's event accumulator, and a real
`mlflow server` (SQLite backend, on loopback) read through MLflow's client.

Run by CTest under scripts/trackers-venv.sh's interpreter (MLflow and
TensorBoard from PyPI); the jobs are plain Python loops marked with
fullburn_markers, the way a script without PyTorch's hooks is marked.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

FULLBURN = os.environ.get("FULLBURN_BIN", "fullburn")

# A training loop in the style of pytorch/examples (argparse, epochs, a
# loader, a log line every few steps), with the model's work and the
# loader's decoding as CPU loops, so it runs anywhere in a few seconds.
JOB = r'''
import argparse, os, sys, time
from fullburn_markers import steps

def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass

class Loader:
    """Decodes each batch in the main process: the input-bound case."""
    def __init__(self, batches, decode_s):
        self.batches, self.decode_s = batches, decode_s
    def __iter__(self):
        for i in range(self.batches):
            spin(self.decode_s)
            yield [i] * 32

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--decode-s", type=float, default=0.03)
    p.add_argument("--compute-s", type=float, default=0.01)
    p.add_argument("--mlflow-run-file", default="")
    args = p.parse_args()
    run = None
    if args.mlflow_run_file:
        import mlflow
        run = mlflow.start_run(run_name="job-own")
        mlflow.log_param("lr", 0.1)
        with open(args.mlflow_run_file, "w") as f:
            f.write(run.info.run_id)
    loss = 10.0
    for epoch in range(args.epochs):
        for step, batch in enumerate(steps(Loader(args.batches, args.decode_s), epoch=epoch)):
            spin(args.compute_s)
            loss *= 0.97
            if run is not None:
                import mlflow
                mlflow.log_metric("train_loss", loss, step=step)
    if run is not None:
        import mlflow
        mlflow.end_run()
    print("done, loss %.3f" % loss)

if __name__ == "__main__":
    main()
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TrackerTestCase(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="fb_trackers_")
        self.store = os.path.join(self.dir, "runs.db")
        self.job = os.path.join(self.dir, "train.py")
        with open(self.job, "w") as f:
            f.write(JOB)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def fullburn(self, *args, env=None, check=True, timeout=240):
        full_env = dict(os.environ, FULLBURN_STORE=self.store, FULLBURN_NO_STACKS="1")
        full_env.update(env or {})
        p = subprocess.run([FULLBURN, *args], capture_output=True, text=True, env=full_env,
                           timeout=timeout)
        if check:
            self.assertEqual(p.returncode, 0, "fullburn %s failed:\n%s\n%s" % (args, p.stdout, p.stderr))
        return p

    def run_job(self, *fullburn_args, job_args=(), **kw):
        return self.fullburn("run", "--interval", "0.5", "-q", *fullburn_args, "--",
                             sys.executable, self.job, *job_args, **kw)

    def stored_steps(self):
        p = self.fullburn("runs", "export", "last", "--table", "steps", "--format", "json")
        return json.loads(p.stdout)

    def stored_samples(self):
        p = self.fullburn("runs", "export", "last", "--format", "json")
        return json.loads(p.stdout)


class TensorBoardFiles(TrackerTestCase):
    """Live (run --tensorboard) and after the fact (runs export), read back
    with TensorBoard's event accumulator: the same steps and values."""

    def scalars(self, folder):
        from tensorboard.backend.event_processing import event_accumulator
        files = [f for f in os.listdir(folder) if "tfevents" in f]
        self.assertEqual(len(files), 1, files)
        acc = event_accumulator.EventAccumulator(os.path.join(folder, files[0]),
                                                 size_guidance={event_accumulator.SCALARS: 0})
        acc.Reload()
        return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}

    def check_against_store(self, scalars):
        steps = self.stored_steps()
        self.assertGreaterEqual(len(steps), 40)
        want = [(s["step"], s["step_s"] * 1000) for s in steps]
        got = scalars["fullburn/step_time_ms"]
        self.assertEqual([s for s, _ in got], [s for s, _ in want])
        for (_, g), (_, w) in zip(got, want):
            self.assertAlmostEqual(g, w, delta=abs(w) * 1e-6 + 1e-6)
        waits = dict(scalars["fullburn/data_wait_pct"])
        for s in steps:
            self.assertAlmostEqual(waits[s["step"]], 100 * s["data_wait_s"] / s["step_s"], delta=1e-3)
        samples = self.stored_samples()["metrics"]["host.cpu_util"]
        interval = 0.5
        got_cpu = dict(scalars["fullburn/host.cpu_util"])
        self.assertEqual(sorted(got_cpu), sorted(round(t / interval) for t in samples["t"]))
        for t, v in zip(samples["t"], samples["v"]):
            self.assertAlmostEqual(got_cpu[round(t / interval)], v, delta=abs(v) * 1e-6 + 1e-5)

    def test_live_and_exported_files_hold_the_stored_values(self):
        live = os.path.join(self.dir, "tb-live")
        # Long enough for the live diagnosis (20 s of steps before its first).
        self.run_job("--tensorboard", live, job_args=("--batches", "650", "--compute-s", "0.005"))
        live_scalars = self.scalars(live)
        self.check_against_store(live_scalars)
        self.assertTrue(any(t.startswith("fullburn/now/") for t in live_scalars), sorted(live_scalars))
        self.assertEqual(len([t for t in live_scalars if t.startswith("fullburn/run/")]), 1)

        exported = os.path.join(self.dir, "tb-export")
        p = self.fullburn("runs", "export", "last", "--format", "tensorboard", exported)
        self.assertIn("tensorboard --logdir", p.stderr)
        exported_scalars = self.scalars(exported)
        self.check_against_store(exported_scalars)
        # The whole run's diagnosis at its end: this loop decodes in its main process.
        causes = [t for t in exported_scalars if t.startswith("fullburn/run/")]
        self.assertEqual(len(causes), 1, sorted(exported_scalars))

    def test_a_folder_it_cannot_write_is_one_line_and_the_job_goes_on(self):
        blocker = os.path.join(self.dir, "taken")
        with open(blocker, "w") as f:
            f.write("a file, not a folder")
        p = self.run_job("--tensorboard", os.path.join(blocker, "tb"), check=False)
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = [l for l in p.stderr.splitlines() if "--tensorboard" in l]
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertIn(os.path.join(blocker, "tb"), lines[0])
        self.assertIn("the run goes on without it", lines[0])
        self.assertGreaterEqual(len(self.stored_steps()), 30)

    def test_export_without_a_folder_says_how(self):
        self.run_job()
        p = self.fullburn("runs", "export", "last", "--format", "tensorboard", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("give their folder", p.stderr)


class MlflowServer(TrackerTestCase):
    """A real `mlflow server` with a SQLite backend on loopback."""

    @classmethod
    def setUpClass(cls):
        cls.server_dir = tempfile.mkdtemp(prefix="fb_mlflow_")
        cls.port = free_port()
        cls.uri = "http://127.0.0.1:%d" % cls.port
        cls.server = None
        cls.start_server()

    @classmethod
    def start_server(cls):
        mlflow_bin = os.path.join(os.path.dirname(sys.executable), "mlflow")
        cls.server_log = open(os.path.join(cls.server_dir, "server.log"), "a")
        cls.server = subprocess.Popen(
            [mlflow_bin, "server", "--backend-store-uri",
             "sqlite:///" + os.path.join(cls.server_dir, "mlflow.db"),
             "--artifacts-destination", os.path.join(cls.server_dir, "artifacts"),
             "--host", "127.0.0.1", "--port", str(cls.port), "--workers", "1"],
            stdout=cls.server_log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(cls.uri + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if cls.server.poll() is not None:
                break
            time.sleep(0.5)
        raise RuntimeError("mlflow server did not start; see " + cls.server_log.name)

    @classmethod
    def stop_server(cls):
        if cls.server is not None and cls.server.poll() is None:
            os.killpg(cls.server.pid, signal.SIGKILL)  # as a crash would
            cls.server.wait()
        cls.server = None
        cls.server_log.close()

    @classmethod
    def tearDownClass(cls):
        cls.stop_server()
        shutil.rmtree(cls.server_dir, ignore_errors=True)

    def client(self):
        import mlflow
        mlflow.set_tracking_uri(self.uri)
        return mlflow.MlflowClient(self.uri)

    def only_run(self, experiment):
        c = self.client()
        exp = c.get_experiment_by_name(experiment)
        self.assertIsNotNone(exp, "no experiment " + experiment)
        runs = c.search_runs([exp.experiment_id])
        self.assertEqual(len(runs), 1, [r.info.run_id for r in runs])
        return runs[0]

    def check_run(self, run_id, own=True):
        c = self.client()
        steps = self.stored_steps()
        history = c.get_metric_history(run_id, "fullburn/step_time_ms")
        self.assertEqual(sorted(m.step for m in history), [s["step"] for s in steps])
        by_step = {m.step: m.value for m in history}
        for s in steps:
            self.assertAlmostEqual(by_step[s["step"]], s["step_s"] * 1000, places=6)
        cpu = c.get_metric_history(run_id, "system/cpu_utilization_percentage")
        self.assertEqual(len(cpu), len(self.stored_samples()["metrics"]["host.cpu_util"]["t"]))
        run = c.get_run(run_id)
        self.assertIn("fullburn.command", run.data.params)
        self.assertIn(self.job, run.data.params["fullburn.command"])
        self.assertIn("fullburn.top_cause", run.data.tags)
        self.assertIn("fullburn.top_cause_pct", run.data.tags)
        names = [a.path for a in c.list_artifacts(run_id)]
        self.assertIn("fullburn-report.html", names)
        self.assertIn("fullburn-diagnose.json", names)
        if own:
            self.assertEqual(run.info.status, "FINISHED")
        return run

    def no_duplicates(self, run_id):
        c = self.client()
        for key in c.get_run(run_id).data.metrics:
            history = c.get_metric_history(run_id, key)
            seen = [(m.step, m.timestamp) for m in history]
            self.assertEqual(len(seen), len(set(seen)), key)

    def test_a_run_logged_live(self):
        p = self.run_job("--mlflow", self.uri, "--mlflow-experiment", "live")
        self.assertIn("logged live", p.stderr)
        run = self.only_run("live")
        self.check_run(run.info.run_id)
        self.no_duplicates(run.info.run_id)

    def test_a_stored_run_pushed_afterwards_and_again(self):
        self.run_job()
        p = self.fullburn("runs", "push", "last", "--mlflow", self.uri, "--mlflow-experiment", "pushed")
        self.assertIn("pushed", p.stderr)
        run = self.only_run("pushed")
        self.check_run(run.info.run_id)
        first = {k: len(self.client().get_metric_history(run.info.run_id, k)) for k in run.data.metrics}
        self.fullburn("runs", "push", "last", "--mlflow", self.uri)
        self.assertEqual(len(self.client().search_runs([run.info.experiment_id])), 1)
        again = {k: len(self.client().get_metric_history(run.info.run_id, k)) for k in first}
        self.assertEqual(again, first)

    def test_a_job_with_its_own_run_is_joined(self):
        own_file = os.path.join(self.dir, "own_run")
        p = self.run_job("--mlflow", job_args=("--mlflow-run-file", own_file),
                         env={"MLFLOW_TRACKING_URI": self.uri, "MLFLOW_EXPERIMENT_NAME": "joined"})
        with open(own_file) as f:
            own = f.read().strip()
        self.assertIn("the job's own MLflow run " + own, p.stderr)
        run = self.only_run("joined")
        self.assertEqual(run.info.run_id, own)
        self.check_run(own, own=False)
        self.assertEqual(run.data.params["lr"], "0.1")  # the job's own logging is untouched
        self.assertIn("train_loss", run.data.metrics)

    def test_system_metric_names_are_mlflows_own(self):
        import mlflow
        mlflow.set_tracking_uri(self.uri)
        mlflow.set_experiment("mlflow-own")
        mlflow.set_system_metrics_sampling_interval(1)
        mlflow.set_system_metrics_samples_before_logging(1)
        with mlflow.start_run(log_system_metrics=True) as r:
            time.sleep(4)
        theirs = set(self.client().get_run(r.info.run_id).data.metrics)
        self.run_job("--mlflow", self.uri, "--mlflow-experiment", "names")
        ours = {k for k in self.only_run("names").data.metrics if k.startswith("system/")}
        self.assertTrue(ours, "fullburn logged no system metrics")
        self.assertLessEqual(ours, theirs, "fullburn's names MLflow does not use: %s" % (ours - theirs))
        # This machine has no GPU for MLflow to sample: its GPU names come
        # from its GPU monitor's source, and fullburn's from a scripted GPU.
        import mlflow.system_metrics.metrics.gpu_monitor as gpu_monitor
        with open(gpu_monitor.__file__) as f:
            gpu_names = set(re.findall(r'f"(gpu_\{i\}_[a-z_]+)"', f.read()))
        self.assertIn("gpu_{i}_utilization_percentage", gpu_names)
        fake = os.environ.get("FAKE_NVML")
        if not fake:
            self.skipTest("no fake NVML library given (FAKE_NVML) for the GPU names")
        script = os.path.join(self.dir, "nvml.json")
        with open(script, "w") as f:
            json.dump({"gpus": [{"name": "Fake H100", "uuid": "GPU-trackers", "util": [97],
                                 "mem_util": [40], "mem_used": [40 << 30], "mem_total": 80 << 30,
                                 "power_mw": [350000], "power_limit_mw": [700000]}]}, f)
        self.run_job("--mlflow", self.uri, "--mlflow-experiment", "names-gpu",
                     env={"FULLBURN_NVML_LIBRARY": fake, "FAKE_NVML_SCRIPT": script})
        gpu_ours = {k[len("system/"):] for k in self.only_run("names-gpu").data.metrics
                    if k.startswith("system/gpu_")}
        self.assertTrue(gpu_ours)
        patterns = {n.replace("{i}", "0") for n in gpu_names}
        self.assertLessEqual(gpu_ours, patterns)

    def test_server_killed_mid_run_then_push_finds_every_value_once(self):
        # Its own run at once (no wait for one of the job's), and a job that
        # outlasts the server by some 15 s.
        job = self.fullburn_popen("run", "--interval", "0.5", "-q", "--mlflow", self.uri,
                                  "--mlflow-experiment", "killed", "--", sys.executable, self.job,
                                  "--batches", "600", "--decode-s", "0.03",
                                  env={"FULLBURN_MLFLOW_JOIN_WAIT": "0"})
        try:
            deadline = time.time() + 120
            while time.time() < deadline:
                exp = self.client().get_experiment_by_name("killed")
                if exp and self.client().search_runs([exp.experiment_id]):
                    run_id = self.client().search_runs([exp.experiment_id])[0].info.run_id
                    if self.client().get_metric_history(run_id, "fullburn/step_time_ms"):
                        break
                time.sleep(1)
            else:
                self.fail("nothing reached MLflow")
            type(self).stop_server()
            out, err = job.communicate(timeout=240)
        finally:
            if job.poll() is None:
                job.kill()
            if self.server is None:
                type(self).start_server()
        self.assertEqual(job.returncode, 0, err)
        troubles = [l for l in err.splitlines() if "cannot reach MLflow" in l]
        self.assertEqual(len(troubles), 1, err)
        self.assertIn("fullburn runs push", err)
        p = self.fullburn("runs", "push", "last", "--mlflow", self.uri)
        run = self.only_run("killed")
        self.assertEqual(run.info.run_id, run_id)  # the same run, not a second
        self.check_run(run_id)
        self.no_duplicates(run_id)

    def test_an_unreachable_server_is_one_line_and_the_job_keeps_its_code(self):
        dead = "http://127.0.0.1:%d" % free_port()
        p = self.run_job("--mlflow", dead, check=False, env={"FULLBURN_MLFLOW_END_WAIT": "3"})
        self.assertEqual(p.returncode, 0, p.stderr)
        troubles = [l for l in p.stderr.splitlines() if "cannot reach MLflow" in l]
        self.assertEqual(len(troubles), 1, p.stderr)
        self.assertIn("fullburn runs push", p.stderr)
        self.assertGreaterEqual(len(self.stored_steps()), 30)

    def fullburn_popen(self, *args, env=None):
        env = dict(os.environ, FULLBURN_STORE=self.store, FULLBURN_NO_STACKS="1", **(env or {}))
        return subprocess.Popen([FULLBURN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env)


if __name__ == "__main__":
    unittest.main()
