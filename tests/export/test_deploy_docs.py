"""docs/deploy.md's TF Serving clients, run against a seq2seq SavedModel export:
the REST client (columnar and row bodies) over HTTP and the gRPC client's
`tensorflow-serving-api` PredictRequest over a real gRPC channel, each served
by a stand-in for `tensorflow_model_server` that first checks the request
against the SavedModel's signature (model name, signature name, input names,
dtypes, ranks) and then runs that signature; the answers equal the Keras
model's. Also: the page's `docker run` line serves the directory the page
exports to (#17)."""

import json
import os
import re
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from tests.export.test_stock_serving import text_seq2seq
from tests.test_docs import DOCS, _blocks

pytestmark = pytest.mark.slow  # seconds per test: make test-fast leaves the file out

TEXTS = ["a man in the snow", "deux chiens", "ｆｕｌｌｗｉｄｔｈ"]
MODEL = "mt"  # the SavedModel's directory name, as in docs/deploy.md


def _page():
    with open(os.path.join(DOCS, "deploy.md"), encoding="utf-8") as f:
        return f.read()


class _Signatures:
    """What the server checks a request against: the loaded SavedModel's signatures."""

    def __init__(self, version_dir):
        self.loaded = tf.saved_model.load(version_dir)

    def run(self, model, signature, inputs, dtypes=None):
        """inputs: name -> NumPy array (dtypes: name -> the request's tf.DType).
        Raises ValueError naming a mismatch."""
        if model != MODEL:
            raise ValueError(f"unknown model {model!r}")
        if signature not in self.loaded.signatures:
            raise ValueError(f"unknown signature {signature!r}")
        fn = self.loaded.signatures[signature]
        specs = fn.structured_input_signature[1]
        if set(inputs) != set(specs):
            raise ValueError(f"inputs {sorted(inputs)} != the signature's {sorted(specs)}")
        feed = {}
        for name, spec in specs.items():
            value = np.asarray(inputs[name])
            dtype = (dtypes or {}).get(name) or (
                tf.string if value.dtype.kind in "SUO" else tf.as_dtype(value.dtype)
            )
            if dtype != spec.dtype:
                raise ValueError(f"{name}: dtype {dtype.name} for a {spec.dtype.name} input")
            if value.ndim != spec.shape.rank:
                raise ValueError(f"{name}: rank {value.ndim} for {spec.shape}")
            feed[name] = tf.constant(value, dtype=spec.dtype)
        return {k: v.numpy() for k, v in fn(**feed).items()}


class _Grpc(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, signatures):
        self.signatures = signatures
        self.requests = []

    def Predict(self, request, context):
        self.requests.append(request)
        inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
        dtypes = {k: tf.as_dtype(v.dtype) for k, v in request.inputs.items()}
        try:
            outputs = self.signatures.run(
                request.model_spec.name,
                request.model_spec.signature_name or "serving_default",
                inputs,
                dtypes,
            )
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        reply = predict_pb2.PredictResponse()
        reply.model_spec.CopyFrom(request.model_spec)
        for name, value in outputs.items():
            reply.outputs[name].CopyFrom(tf.make_tensor_proto(value))
        return reply


def _jsonable(value):
    if value.dtype.kind in "SO":
        return np.vectorize(lambda b: b.decode("utf-8"), otypes=[object])(value).tolist()
    return value.tolist()


def _rest_handler(signatures, seen):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            found = re.fullmatch(r"/v1/models/([^/:]+):predict", self.path)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            try:
                if not found:
                    raise ValueError(f"not a predict URL: {self.path}")
                signature = body.get("signature_name", "serving_default")
                if "inputs" in body:
                    inputs = {k: np.asarray(v) for k, v in body["inputs"].items()}
                    outputs = signatures.run(found[1], signature, inputs)
                    reply = {"outputs": {k: _jsonable(v) for k, v in outputs.items()}}
                else:
                    rows = body["instances"]
                    inputs = {k: np.asarray([row[k] for row in rows]) for k in rows[0]}
                    outputs = signatures.run(found[1], signature, inputs)
                    reply = {
                        "predictions": [
                            {k: _jsonable(np.asarray(v[i])) for k, v in outputs.items()}
                            for i in range(len(rows))
                        ]
                    }
                code, data = 200, json.dumps(reply).encode()
            except (ValueError, KeyError) as e:
                code, data = 400, json.dumps({"error": str(e)}).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


@pytest.fixture(scope="module")
def served():
    model, version, _ = text_seq2seq()
    signatures = _Signatures(version)
    grpc_service = _Grpc(signatures)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(grpc_service, server)
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    seen = []
    http = ThreadingHTTPServer(("127.0.0.1", 0), _rest_handler(signatures, seen))
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    namespace = {}
    for _, lang, code in _blocks("docs/deploy.md"):
        if lang == "python" and ("def rest_translate" in code or "def grpc_translate" in code):
            exec(compile(code, "docs/deploy.md", "exec"), namespace)
    yield {
        "model": model,
        "version": version,
        "ns": namespace,
        "grpc": f"127.0.0.1:{grpc_port}",
        "rest": f"http://127.0.0.1:{http.server_address[1]}/v1/models/{MODEL}:predict",
        "service": grpc_service,
        "seen": seen,
    }
    http.shutdown()
    server.stop(None)


def test_rest_clients_get_the_keras_translation(served):
    want = served["model"].translate(TEXTS)
    ns = served["ns"]
    assert ns["rest_translate"](TEXTS, url=served["rest"]) == want
    assert ns["rest_translate_rows"](TEXTS, url=served["rest"]) == want
    # The bodies use the names signature.json gives the signature's inputs.
    with open(os.path.join(served["version"], "signature.json")) as f:
        documented = json.load(f)["signatures"]["translate"]
    assert set(served["seen"][0]["inputs"]) == set(documented["inputs"])
    assert set(served["seen"][1]["instances"][0]) == set(documented["inputs"])


def test_grpc_client_gets_the_keras_translation(served):
    want = served["model"].translate(TEXTS)
    assert served["ns"]["grpc_translate"](TEXTS, target=served["grpc"]) == want
    request = served["service"].requests[-1]
    assert (request.model_spec.name, request.model_spec.signature_name) == (MODEL, "translate")


def test_a_request_that_breaks_the_signature_is_refused(served):
    """The stand-in server's checks can fail: a wrong input name or dtype."""
    bad = served["ns"]["predict_request"](TEXTS)
    bad.inputs["source"].CopyFrom(bad.inputs.pop("text"))
    with grpc.insecure_channel(served["grpc"]) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError, match="inputs"):
            stub.Predict(bad, timeout=60)
        wrong = served["ns"]["predict_request"](TEXTS)
        wrong.inputs["text"].CopyFrom(tf.make_tensor_proto(np.array([1, 2], np.int32)))
        with pytest.raises(grpc.RpcError, match="dtype"):
            stub.Predict(wrong, timeout=60)


def test_docker_line_serves_the_exported_directory():
    page = _page()
    docker = [line.strip() for line in page.splitlines() if line.strip().startswith("docker run")]
    assert len(docker) == 1, docker
    line = docker[0]
    for part in ("-p 8500:8500", "-p 8501:8501", f"-e MODEL_NAME={MODEL}", "tensorflow/serving"):
        assert part in line, part
    mount = re.search(r"source=\"?\$PWD/([^\",]+)\"?,target=(\S+)", line)
    assert mount and mount[2] == f"/models/{MODEL}"
    assert f"python -m export savedmodel runs/mt --out {mount[1]}" in page


# ---------------------------------------------------------------- mobile recipes
SNIPPET = re.compile(r"^```(kotlin|swift)\n(.*?)^```", re.S | re.M)
TYPED = re.compile(r"// (\w+): (int32|float32) \[([^\]]*)\]")


def _snippets():
    """(language, export key of export.mobile.TENSORS, code) of the page's app snippets."""
    from export import mobile

    out = []
    for lang, code in SNIPPET.findall(_page()):
        first = code.splitlines()[0]  # "// steps.tflite": the export it runs
        (key,) = [k for k in mobile.TENSORS if k.startswith(first[3:] + " ")]
        out.append((lang, key, code))
    return out


def _used(lang, code):
    """{signature: {"inputs": names fed, "outputs": names read}} in a snippet."""
    used = {}

    def add(signature, way, names):
        used.setdefault(signature, {"inputs": set(), "outputs": set()})[way] |= set(names)

    if lang == "kotlin":
        for way, call in (("inputs", "inputs"), ("outputs", "outputs")):
            for signature, names in re.findall(rf'\b{call}\("(\w+)", ([^)]*)\)', code):
                add(signature, way, re.findall(r'"(\w+)"', names))
        for way, arg in (("inputs", "inputName"), ("outputs", "outputName")):
            for name, signature in re.findall(rf'{arg} = "(\w+)", signature = "(\w+)"', code):
                add(signature, way, [name])
    else:
        runners = dict(
            re.findall(r'let (\w+) = try interpreter\.signatureRunner\(with: "(\w+)"\)', code)
        )
        invokes = re.compile(r"(\w+)\.invoke\(with: \[(.*?)\]\)$", re.S | re.M)
        for runner, body in invokes.findall(code):
            add(runners[runner], "inputs", re.findall(r'"(\w+)":', body))
        for runner, name in re.findall(r'(\w+)\.output\(named: "(\w+)"\)', code):
            add(runners[runner], "outputs", [name])
    return used


def test_mobile_table_is_the_generated_one():
    from export import mobile

    page = _page()
    start, end = page.index(mobile.BEGIN), page.index(mobile.END) + len(mobile.END)
    assert page[start:end] == mobile.render()


def test_mobile_snippets_use_the_tables_names_and_shapes():
    from export import mobile

    snippets = _snippets()
    # Each export has an Android and an iOS recipe.
    assert sorted((lang, key) for lang, key, _ in snippets) == sorted(
        (lang, key) for lang in ("kotlin", "swift") for key in mobile.TENSORS
    )
    for lang, key, code in snippets:
        table = mobile.TENSORS[key]
        used = _used(lang, code)
        for signature, ways in used.items():
            inputs, outputs = table[signature]
            # A run feeds every input of its signature, and reads only its outputs.
            assert ways["inputs"] == set(inputs), (lang, signature)
            assert ways["outputs"] and ways["outputs"] <= set(outputs), (lang, signature)
        assert set(used) == set(table), (lang, key)
        typed = TYPED.findall(code)
        assert typed, (lang, key)
        for name, dtype, shape in typed:
            known = {
                (n, d, ", ".join(s))
                for inputs, outputs in table.values()
                for n, (d, s) in {**inputs, **outputs}.items()
            }
            assert (name, dtype, shape) in known, (lang, name, dtype, shape)


def _litert_signatures(path):
    from zoo.litert import interpreter

    interp = interpreter(path)
    out = {}
    for signature in interp.get_signature_list():
        runner = interp.get_signature_runner(signature)
        out[signature] = {
            way: {
                name: (np.dtype(d["dtype"]).name, [int(x) for x in d["shape"]])
                for name, d in details.items()
            }
            for way, details in (
                ("inputs", runner.get_input_details()),
                ("outputs", runner.get_output_details()),
            )
        }
    return out


def test_mobile_table_matches_fresh_exports(served, tmp_path):
    import keras

    import zoo
    from export import mobile
    from export.kinds import seq2seq as seq2seq_kind
    from export.tflite import export_tflite
    from tests.support.runs import make_tagger_run

    model = served["model"]
    sizes = {
        "S": model.max_source_length,
        "L": model.max_target_length,
        "N": model.num_layers,
        "H": model.num_heads,
        "d": model.hidden_dim // model.num_heads,
        "V": model.tokenizer.vocabulary_size,
    }
    steps = [k for k in mobile.TENSORS if k.startswith("steps.tflite")][0]
    want = mobile.instantiate(steps, sizes)
    path = tmp_path / "steps.tflite"
    path.write_bytes(seq2seq_kind.convert_steps(model))
    assert _litert_signatures(str(path)) == want
    # The SavedModel's signature.json lists the same step signatures.
    with open(os.path.join(served["version"], "signature.json")) as f:
        documented = json.load(f)["signatures"]
    for signature, ways in want.items():
        for way, tensors in ways.items():
            got = {n: (v["dtype"], v["shape"]) for n, v in documented[signature][way].items()}
            assert got == tensors, (signature, way)

    keras.utils.set_random_seed(0)
    run = str(tmp_path / "tagger-run")
    tagger = make_tagger_run(run)
    export_tflite(run, str(tmp_path / "tagger.tflite"), static_shape=True)
    generator = zoo.build(
        "sagan_generator", image_size=32, channels=1, num_classes=3, latent_dim=8, width=4
    )
    export_tflite(generator, str(tmp_path / "sagan.tflite"), static_shape=True)
    for name, sizes in (
        ("tagger", {"T": tagger.max_len, "M": tagger.max_chars, "K": len(tagger.tags)}),
        ("sagan", {"Z": 8, "R": 32, "C": 1}),
    ):
        key = [k for k in mobile.TENSORS if k.startswith(f"{name}.tflite")][0]
        file = str(tmp_path / f"{name}.tflite")
        want = mobile.instantiate(key, sizes)
        assert _litert_signatures(file) == want, name
        with open(file + ".json") as f:  # the sidecar an app reads, too
            sidecar = json.load(f)
        for way in ("inputs", "outputs"):
            got = {n: (v["dtype"], v["shape"]) for n, v in sidecar[way].items()}
            assert got == want["serving_default"][way], (name, way)
