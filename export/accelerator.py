"""LiteRT's real GPU accelerator: compile, run, compare with CPU, time.

`ai_edge_litert`'s `CompiledModel` with `HardwareAccelerator.GPU` is LiteRT's GPU
accelerator (WebGPU through Dawn, over Vulkan). It needs a Vulkan device: a GPU,
or Mesa >= 25's lavapipe, a Vulkan driver that runs on the CPU (README, "GPU
export"). Static rules (export/check.py) say what the delegate should accept;
this module asks the delegate itself, and compares its numbers with LiteRT's CPU
runtime, because "compiles" and `is_fully_accelerated()` do not mean "correct"
(docs/facts.md: a matmul whose shader failed to compile returned wrong values).

Used by `python -m export verify FILE --accelerator gpu` and the tests.
"""

import base64
import contextlib
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

from zoo import litert as runtime

HOW_TO_GET_ONE = (
    "no Vulkan device for LiteRT's GPU accelerator: run on a machine with a GPU and its Vulkan driver, "
    "or install Mesa >= 25's CPU driver (Debian 12: apt-get install -t bookworm-backports "
    "mesa-vulkan-drivers; README, 'GPU export')"
)

# x [1, 4] float32 -> y = 2x + 1 (serving_default): the probe model.
_PROBE = base64.b64decode(
    "HAAAAFRGTDMUACAAHAAYABQAEAAMAAAACAAEABQAAAAcAAAAhAAAANwAAAC8AQAAzAEAANQDAAADAAAAAQAAABAAAAAAAAoAEAAM"
    "AAgABAAKAAAADAAAABwAAAA0AAAADwAAAHNlcnZpbmdfZGVmYXVsdAABAAAABAAAAKT///8EAAAABAAAAAEAAAB5AAAAAQAAAAQA"
    "AADO/v//BAAAAAEAAAB4AAAAAgAAADQAAAAEAAAA3P///wcAAAAEAAAAEwAAAENPTlZFUlNJT05fTUVUQURBVEEACAAMAAgABAAI"
    "AAAABgAAAAQAAAATAAAAbWluX3J1bnRpbWVfdmVyc2lvbgAIAAAA3AAAANQAAADAAAAApAAAAJwAAACUAAAAdAAAAAQAAABe////"
    "BAAAAGAAAAAQAAAAAAAAAAgADgAIAAQACAAAABAAAAAkAAAAAAAGAAgABAAGAAAABAAAAAAAAAAMABgAFAAQAAwABAAMAAAAN2V/"
    "sBc23e0DAAAAAgAAAAQAAAAGAAAAMi4yMS4wAADK////BAAAABAAAAAxLjUuMAAAAAAAAAAAAAAAnP3//6D9///u////BAAAAAQA"
    "AAAAAABAAAAGAAgABAAGAAAABAAAAAQAAAAAAIA/zP3//9D9//8PAAAATUxJUiBDb252ZXJ0ZWQuAAEAAAAUAAAAAAAOABgAFAAQ"
    "AAwACAAEAA4AAAAUAAAAHAAAAKAAAACkAAAAqAAAAAQAAABtYWluAAAAAAIAAABYAAAAFAAAAAAADgAYABQAEAAMAAsABAAOAAAA"
    "FAAAAAAAAAsQAAAAFAAAAAEAAABY/v//AQAAAAQAAAACAAAAAwAAAAEAAAAAAA4AFAAAABAADAALAAQADgAAABAAAAAAAAAVDAAA"
    "ABAAAACU/v//AQAAAAMAAAACAAAAAAAAAAIAAAABAAAABAAAAAEAAAAAAAAABQAAAPQAAACsAAAAfAAAAEgAAAAEAAAANv///wAA"
    "AAEQAAAAEAAAAAUAAAAgAAAA7P7//xEAAABQYXJ0aXRpb25lZENhbGw6MAAAAAIAAAABAAAABAAAAHb///8AAAABEAAAABAAAAAE"
    "AAAAEAAAACz///8DAAAAbXVsAAIAAAABAAAABAAAAKb///8AAAABEAAAABAAAAADAAAAFAAAAFz///8FAAAAbXVsL3kAAAAAAAAA"
    "0v///wAAAAEQAAAAEAAAAAIAAAAUAAAAiP///wUAAABhZGQveQAAAAAAAAAAABYAGAAUAAAAEAAMAAgAAAAAAAAABwAWAAAAAAAA"
    "ARAAAAAQAAAAAQAAACAAAADM////EwAAAHNlcnZpbmdfZGVmYXVsdF94OjAAAgAAAAEAAAAEAAAAAgAAABwAAAAIAAAABAAEAAQA"
    "AAAMAAwACwAAAAAABAAMAAAAEgAAAAAAABI="
)


def ensure_runtime_dir():
    """Dawn wants a writable XDG_RUNTIME_DIR; a private temporary one if unset."""
    d = os.environ.get("XDG_RUNTIME_DIR")
    if not d or not os.path.isdir(d) or not os.access(d, os.W_OK):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="litert-xdg-")


@contextlib.contextmanager
def captured_stderr():
    """fd 2 into a file while the block runs (LiteRT's C++ logs go there);
    yields a list that holds the captured text afterwards."""
    out = []
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        yield out
        return
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            yield out
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            out.append(f.read().decode("utf-8", "replace"))


_NOISE = (
    "IntelOpenvino",
    "libopenvino",
    "npu_registry",
    "NPU accelerator",
    "Logging before InitGoogle",
    "Source Location Trace",
    "artificially reduced",
)


def log_errors(text, limit=3):
    """The delegate's own error lines in captured LiteRT output (one line each)."""
    lines = []
    for line in text.splitlines():
        line = line.strip().lstrip("└ ").strip()
        if (
            not line
            or any(n in line for n in _NOISE)
            or re.match(r"(INFO|WARNING|VERBOSE|I\d{4}|W\d{4}) ", line)
            or line.startswith(("INFO:", "VERBOSE:"))
        ):
            continue
        if re.search(
            r"(^E\d{4}|ERROR|[Ee]rror|Failed|failed|mismatch|not supported|Unsupported|^[A-Z][A-Z0-9_]+: )",
            line,
        ):
            line = re.sub(r"^E\d{4} [\d:. ]+\d+ ", "", line)
            if line not in lines:
                lines.append(line[:300])
    return lines[:limit]


def device_problem():
    """None when LiteRT's GPU accelerator runs here, else one line saying why not
    and how to get one. Probed on each call: the probe model through
    `run_many_in_child` (a driver problem cannot take this process down)."""
    with tempfile.TemporaryDirectory(prefix="litert-probe-") as tmp:
        path = os.path.join(tmp, "probe.tflite")
        with open(path, "wb") as f:
            f.write(_PROBE)
        feeds = {"serving_default": [{"x": np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)}]}
        result = run_many_in_child([(path, feeds, None, 0)], timeout=120)[0]
    gpu = result.get("gpu") or {}
    y = (gpu.get("outputs", {}).get("serving_default") or [{}])[0].get("y")
    if y is not None and abs(float(y[0, 3]) - 9.0) < 1e-2:
        return None
    text = "\n".join([result["crashed"] or "", gpu.get("error", ""), *gpu.get("log", [])])
    if re.search(r"No adapters found|Found no drivers|INCOMPATIBLE_DRIVER", text):
        why = "no Vulkan adapter found"
    else:
        why = result["crashed"] or "; ".join(gpu.get("log", [])[:2]) or gpu.get("error")
        why = why or gpu.get("run_error") or f"wrong result {y}"
    return f"{HOW_TO_GET_ONE} ({why})"


class CompileError(RuntimeError):
    """The accelerator refused the model; `.log` holds the delegate's lines."""

    def __init__(self, message, log=()):
        super().__init__(message)
        self.log = list(log)


class Compiled:
    """A .tflite file compiled for one accelerator: "cpu", "gpu" (the
    GPU alone, its default reduced precision, as an app gets it) or "gpu_f32"
    (the GPU alone computing in float32: tells precision from a wrong op), with
    one set of input/output buffers per signature, reused across runs."""

    def __init__(self, path, accelerator="gpu"):
        from ai_edge_litert.compiled_model import CompiledModel
        from ai_edge_litert.hardware_accelerator import HardwareAccelerator
        from ai_edge_litert.options import CpuOptions, GpuOptions, Options

        if accelerator == "cpu":
            options = Options(
                hardware_accelerators=HardwareAccelerator.CPU, cpu_options=CpuOptions(num_threads=1)
            )
        else:
            ensure_runtime_dir()
            options = Options(
                hardware_accelerators=HardwareAccelerator.GPU,
                gpu_options=GpuOptions(enforce_f32=accelerator == "gpu_f32"),
            )
        with captured_stderr() as log:
            try:
                self.model = CompiledModel.from_file(str(path), options=options)
                error = None
            except RuntimeError as e:
                error = e
        self.log = log[0] if log else ""
        if error is not None:
            lines = log_errors(self.log, 6) or [" ".join(str(error).split())[:200]]
            # the delegate names each op it rejects as "OP: reason"
            ops = [
                l for l in lines if re.match(r"[A-Z][A-Z0-9_]+: ", l) and not l.startswith("ERROR")
            ]
            raise CompileError(
                f"{accelerator} accelerator refused the model: {'; '.join(ops) or lines[0]}",
                lines,
            )
        self.fully_accelerated = bool(self.model.is_fully_accelerated())
        self._buffers = {}

    def _io(self, signature):
        if signature not in self._buffers:
            m = self.model
            ins = m.get_input_tensor_details(signature)
            outs = m.get_output_tensor_details(signature)
            self._buffers[signature] = (
                {k: (m.create_input_buffer_by_name(signature, k), d) for k, d in ins.items()},
                {k: (m.create_output_buffer_by_name(signature, k), d) for k, d in outs.items()},
            )
        return self._buffers[signature]

    def shape(self, signature, name):
        """The shape of `signature`'s input or output `name`."""
        ins, outs = self._io(signature)
        return [int(x) for x in (ins[name] if name in ins else outs[name])[1]["shape"]]

    def _resize(self, signature, inputs):
        """Resizes dynamic inputs to the shapes of `inputs` (both accelerators
        take a new shape for a model with -1 dimensions; buffers are made anew)."""
        ins, _ = self._io(signature)
        changed = False
        for k, (_, d) in ins.items():
            a = np.asarray(inputs.get(k))
            if (
                k in inputs
                and a.ndim == len(d["shape"])
                and list(a.shape) != [int(x) for x in d["shape"]]
            ):
                self.model.resize_input_tensor_by_name(signature, k, list(a.shape), strict=False)
                changed = True
        if changed:
            del self._buffers[signature]

    def write(self, signature, inputs):
        self._resize(signature, inputs)
        ins, _ = self._io(signature)
        for k, (buf, d) in ins.items():
            if k not in inputs:
                raise ValueError(f"signature {signature!r} needs input {k!r}")
            a = np.asarray(inputs[k], dtype=np.dtype(d["dtype"]))
            shape = [int(x) for x in d["shape"]]
            if a.size != int(np.prod(shape)):
                raise ValueError(f"input {k!r}: shape {list(a.shape)} does not fit {shape}")
            buf.write(np.ascontiguousarray(a).reshape(-1))

    def read(self, signature, names=None):
        _, outs = self._io(signature)
        result = {}
        for k, (buf, d) in outs.items():
            if names is not None and k not in names:
                continue
            shape = [int(x) for x in d["shape"]]
            result[k] = np.asarray(buf.read(int(np.prod(shape)), np.dtype(d["dtype"]))).reshape(
                shape
            )
        return result

    def invoke(self, signature):
        ins, outs = self._io(signature)
        self.model.run_by_name(
            signature, {k: b for k, (b, _) in ins.items()}, {k: b for k, (b, _) in outs.items()}
        )

    def run(self, signature, inputs):
        """One call: writes `inputs` (arrays of the signature's exact shapes), runs,
        reads every output back (waiting for the device)."""
        self.write(signature, inputs)
        self.invoke(signature)
        return self.read(signature)

    def runner(self, signature):
        """A callable like an Interpreter's signature runner."""
        return lambda **inputs: self.run(signature, inputs)

    def time(self, signature, inputs, runs=20, warmup=3):
        """`latency` of write + run + a read of the smallest output: the read
        waits for the device, so the work is inside the timed loop (timing
        `run_by_name` alone measures only the enqueue on a GPU)."""
        self.write(signature, inputs)  # resizes first, where inputs ask for it
        _, outs = self._io(signature)
        smallest = min(outs, key=lambda k: int(np.prod(outs[k][1]["shape"])))

        def call():
            self.write(signature, inputs)
            self.invoke(signature)
            self.read(signature, names=(smallest,))

        return latency(call, runs, warmup)


def latency(call, runs, warmup):
    """Percentiles and mean of `runs` timed calls (ms) after `warmup` untimed ones."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        call()
        times.append((time.perf_counter() - t) * 1e3)
    p = np.percentile(times, [50, 90, 99])
    return {
        "p50_ms": float(p[0]),
        "p90_ms": float(p[1]),
        "p99_ms": float(p[2]),
        "mean_ms": float(np.mean(times)),
        "runs": runs,
    }


def tolerance_for(reference, rel=0.03, floor=0.03):
    """The GPU computes in reduced precision (fp16 by default): an output is
    right within max(floor, rel * its largest magnitude). Measured gaps of
    right models: up to 0.019 on [0, 1] images and 0.013 on probabilities
    (float32 on the GPU: 2.5e-6); wrong ops were off by 0.39 to 7.8."""
    return {
        k: max(floor, rel * float(np.max(np.abs(np.asarray(v, np.float64)))))
        if np.asarray(v).size
        else floor
        for k, v in reference.items()
        if np.issubdtype(np.asarray(v).dtype, np.floating)
    }


# ---------------------------------------------------------------- child process
# TensorFlow and the GPU accelerator do not share a process (docs/facts.md, LiteRT):
# it runs in a child that imports neither TensorFlow nor Keras, and the child's own
# crash is a verdict, not the caller's death.
_JOB = r"""
import sys
sys.path.insert(0, sys.argv[1])
from export import accelerator
accelerator._child_main(sys.argv[2])
"""


def _child_main(workdir):
    """Runs every job of jobs.pkl in turn, writing result_<i>.pkl as each
    finishes (a crash loses only the model it happened in)."""
    with open(os.path.join(workdir, "jobs.pkl"), "rb") as f:
        jobs = pickle.load(f)
    for n, job in enumerate(jobs):
        result = {}
        for acc in job["accelerators"]:
            entry = result[acc] = {"outputs": {sig: [] for sig in job["feeds"]}}
            try:
                m = Compiled(job["path"], acc)
            except CompileError as e:
                entry.update(compiled=False, error=str(e), log=e.log)
                continue
            entry.update(
                compiled=True,
                fully_accelerated=m.fully_accelerated,
                log=log_errors(m.log),
                latency={},
            )
            with captured_stderr() as run_log:
                try:
                    _child_runs(job, m, entry, acc)
                except RuntimeError as e:
                    entry["run_error"] = " ".join(str(e).split())[:300]
            entry["run_log"] = log_errors(run_log[0] if run_log else "")
            del m
        if "tensorflow" in sys.modules:
            result["warning"] = "tensorflow was imported in the accelerator's process"
        with open(os.path.join(workdir, f"result_{n}.pkl"), "wb") as f:
            pickle.dump(result, f)


def _child_runs(job, m, entry, acc):
    """Runs every row of every signature (and the greedy loop) on `m`."""
    for sig, rows in job["feeds"].items():
        for row in rows:
            entry["outputs"][sig].append(m.run(sig, row))
        if rows and job["runs"] and acc != "gpu_f32":
            entry["latency"][sig] = m.time(sig, rows[0], runs=job["runs"])
    if job["greedy"] and acc != "gpu_f32":
        # The app loop (zoo.litert.StepModel) on this accelerator.
        steps = runtime.StepModel(
            m.runner("encode"),
            m.runner("decode_step"),
            m.shape("encode", "source_ids")[1],
            m.shape("decode_step", "self_cache"),
            m.shape("decode_step", "logits")[-1],
        )
        entry["greedy"], entry["margins"] = [], []
        for source_ids in job["greedy"]["rows"]:
            margins = []
            ids = np.asarray(source_ids).reshape(-1)
            entry["greedy"].append(steps.greedy(ids, job["greedy"]["length"], margins)[0])
            entry["margins"].append(margins)


def run_many_in_child(jobs, timeout=600, f32=False):
    """Runs each (path, feeds, greedy, runs) job on CPU and on the GPU accelerator
    in one fresh process; where a model takes the process down, it gets the crash
    as its result and the models after it run in a new process.

    Args:
        jobs: (path, feeds, greedy, runs) each. feeds: {signature: [ {input:
            array of the exact shape}, ... ]}. greedy: None or {"rows":
            [source_ids [1, S], ...], "length": L}: the seq2seq app loop
            (`zoo.litert.StepModel.greedy`) on each row, on each accelerator. runs: timed runs
            per signature (on the first row), 0 for none.
        f32: also run on the GPU computing in float32 ("gpu_f32"; no greedy
            loop or timing there).

    Returns:
        per job, {"cpu"|"gpu"|"gpu_f32": {"compiled", "fully_accelerated", "log",
        "error", "run_error", "outputs": {signature: [ {output: array}, ... ]},
        "latency", "greedy"}, "crashed": None or a message}.
    """
    ensure_runtime_dir()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    accelerators = ["cpu", "gpu"] + (["gpu_f32"] if f32 else [])
    results = [None] * len(jobs)
    start = 0
    while start < len(jobs):
        with tempfile.TemporaryDirectory(prefix="export-accelerator-") as tmp:
            batch = [
                {
                    "path": os.path.abspath(path),
                    "feeds": feeds,
                    "greedy": greedy,
                    "runs": runs,
                    "accelerators": accelerators,
                }
                for path, feeds, greedy, runs in jobs[start:]
            ]
            with open(os.path.join(tmp, "jobs.pkl"), "wb") as f:
                pickle.dump(batch, f)
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            env["TF_CPP_MIN_LOG_LEVEL"] = "0"
            crash = None
            try:
                proc = subprocess.run(
                    [sys.executable, "-c", _JOB, root, tmp],
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                    env=env,
                    check=False,
                )
                if proc.returncode != 0:
                    why = (
                        f"signal {-proc.returncode}"
                        if proc.returncode < 0
                        else f"exit {proc.returncode}"
                    )
                    tail = log_errors(proc.stderr + proc.stdout, 2)
                    crash = f"the accelerator's process died ({why})" + (
                        f": {'; '.join(tail)}" if tail else ""
                    )
            except subprocess.TimeoutExpired:
                crash = f"the accelerator's process ran past {timeout} s"
            done = 0
            while done < len(batch) and os.path.exists(os.path.join(tmp, f"result_{done}.pkl")):
                with open(os.path.join(tmp, f"result_{done}.pkl"), "rb") as f:
                    results[start + done] = dict(pickle.load(f), crashed=None)
                done += 1
        if done < len(batch):
            results[start + done] = {"crashed": crash or "the accelerator's process left no result"}
            done += 1
        start += done
    return results


def synthetic_feeds(path):
    """{signature: two rows of inputs} for any .tflite: floats in [-1, 1], integers
    in [0, 4) (small, so they index any table of >= 4 rows)."""
    interp = runtime.interpreter(path)
    rng = np.random.default_rng(0)
    feeds = {}
    for sig in interp.get_signature_list():
        details = interp.get_signature_runner(sig).get_input_details()
        feeds[sig] = []
        for _ in range(2):
            row = {}
            for k, d in details.items():
                # a -1 (dynamic) dimension runs at 3, not the placeholder 1
                shape = [3 if int(x) < 0 else int(x) for x in d.get("shape_signature", d["shape"])]
                dtype = np.dtype(d["dtype"])
                if np.issubdtype(dtype, np.floating):
                    row[k] = rng.uniform(-1, 1, shape).astype(dtype)
                elif dtype == np.bool_:
                    row[k] = rng.integers(0, 2, shape).astype(bool)
                else:
                    row[k] = rng.integers(0, 4, shape).astype(dtype)
            feeds[sig].append(row)
    return feeds


def real_verdicts(paths):
    """What LiteRT's GPU accelerator does with each of `paths`: (accepted, why),
    run in one child process. Accepted means: compiles with the GPU accelerator
    alone, reports itself fully accelerated, and every output of every signature
    on its `synthetic_feeds` passes `compare_rows` against LiteRT's CPU, integer
    outputs all equal."""
    feeds = [synthetic_feeds(p) for p in paths]
    results = run_many_in_child([(p, f, None, 0) for p, f in zip(paths, feeds)])
    return [_verdict(r, f) for r, f in zip(results, feeds)]


def _verdict(result, feeds):
    """(accepted, why) of one `run_many_in_child` result by `judge`, integer
    outputs all equal."""
    report = judge(result, feeds, min_equal=1.0)
    if not report["compiled"]:
        return False, report["error"]
    return report["ok"], (report["fails"] or ["fully accelerated, outputs match CPU"])[0]


def judge(result, feeds, min_equal=0.95, class_output=None, masks=None):
    """The verdict on one `run_many_in_child` result, failing closed: the CPU
    reference and the GPU alone both compiled and ran every row of every
    signature without an error, the GPU fully accelerated, and every signature
    passes `compare_rows` (`masks`: {signature: mask} for its rows).

    Returns:
        {"compiled", "error" (when not compiled), "fully_accelerated",
        "delegate_log", "run_errors", "signatures": {signature: `compare_rows`
        entry}, "fails", "ok"}.
    """
    if result["crashed"]:
        return {"compiled": False, "error": result["crashed"], "ok": False}
    cpu, gpu = result["cpu"], result["gpu"]
    if not cpu.get("compiled"):
        why = f"LiteRT's CPU runtime (the reference) cannot run it: {cpu.get('error')}"
        return {"compiled": False, "error": why, "ok": False}
    if not gpu["compiled"]:
        return {"compiled": False, "error": gpu["error"], "log": gpu["log"], "ok": False}
    errors = [
        f"{k}: {result[k]['run_error']}" for k in ("cpu", "gpu") if result[k].get("run_error")
    ]
    signatures = {
        sig: compare_rows(
            cpu["outputs"].get(sig, []),
            gpu["outputs"].get(sig, []),
            len(rows),
            class_output,
            (masks or {}).get(sig),
            min_equal,
        )
        for sig, rows in feeds.items()
    }
    fails = [] if gpu["fully_accelerated"] else ["compiled but not fully accelerated"]
    fails += [f"failed to run on {e}" for e in errors]
    fails += [f"{sig}: {why}" for sig, e in signatures.items() for why in e["fails"]]
    if not feeds:
        fails.append("no signature was fed: nothing compared")
    return {
        "compiled": True,
        "fully_accelerated": gpu["fully_accelerated"],
        "delegate_log": list(dict.fromkeys(gpu["log"] + gpu["run_log"])),
        "run_errors": errors,
        "signatures": signatures,
        "fails": fails,
        "ok": not fails,
    }


def stack(rows):
    """{name: the rows' arrays joined on the first axis} (batch-1 rows make a
    batch); a name some row lacks is left out."""
    names = set.intersection(*map(set, rows)) if rows else ()
    return {k: np.concatenate([np.atleast_1d(r[k]) for r in rows]) for k in sorted(names)}


def compare_rows(cpu_rows, gpu_rows, fed, class_output=None, mask=None, min_equal=0.95):
    """One signature's rows, LiteRT's CPU (the reference) against the GPU, by
    `zoo.litert.compare` and `gate` (failing closed: every row and every reference
    output back and finite; integer outputs and `class_output`'s argmax equal on
    >= `min_equal` of the positions `mask` keeps), float outputs within
    `tolerance_for`: the GPU's tolerance is per output, `gate`'s one bound is not.

    Returns:
        `compare`'s report with "rows", "tolerance", "fails" and "ok".
    """
    entry = {"rows": len(cpu_rows), "max_abs_diff": {}, "tolerance": {}, "agreement": None}
    if not 0 < fed == len(cpu_rows) == len(gpu_rows):
        fails = [
            f"{fed} rows fed, {len(cpu_rows)} came back from CPU, {len(gpu_rows)} from the GPU"
        ]
        return dict(entry, fails=fails, ok=False)
    want = stack(cpu_rows)
    entry.update(runtime.compare(want, stack(gpu_rows), mask, class_output))
    lost = sorted({k for r in cpu_rows for k in r} - set(want))
    fails = [f"the CPU reference returned no {k!r} for some rows" for k in lost]
    fails += runtime.gate(entry, float("inf"), min_equal)
    tol = entry["tolerance"] = tolerance_for(want)
    fails += [
        f"output {k!r} differs by {d:.3g} > {tol[k]:.2g}"
        for k, d in entry["max_abs_diff"].items()
        if not d <= tol[k]
    ]
    return dict(entry, fails=fails, ok=not fails)
