"""Export plugin for `zoo.seq2seq.transformer` / `zoo.seq2seq.universal_transformer` runs.

SavedModel signatures (TF Serving; core TensorFlow ops only, so the stock
`tensorflow_model_server` loads them and a Python client needs no
`tensorflow_text`):
  translate(text: string [B])        -> translation string [B], token_ids int32 [B, L]
  serving_default                    the same as translate
  translate_ids(source_ids int32 [B, S]) -> token_ids int32 [B, L]
  encode, decode_step                steps.tflite's two signatures (below), the same
                                     functions, for clients that run the loop (beam
                                     search, sampling) themselves
The tokenizer (SentencePiece rebuilt from lookup tables, `tf.strings` and
`tf.while_loop`: `zoo.seq2seq.sentencepiece_graph`, the `sentencepiece`
package's ids) and greedy cached decoding run inside the graph: strings in,
strings out. The SentencePiece model itself ships as `assets.extra/spm.model`.

TFLite (builtin ops only):
  `python -m export tflite RUN --out greedy.tflite`: the full greedy loop as one
      WHILE (source_ids [1, S] -> tokens [1, L]); for CPU.
  `python -m export.kinds.seq2seq RUN --out DIR`: that file plus `steps.tflite`
      with two signatures for apps (and GPU delegates) that run the loop:
      encode(source_ids [1, S]) -> cross_cache [2C, S, H, d], encoder_mask [1, S]
      decode_step(token [1], position [], cross_cache, encoder_mask,
                  self_cache [2N, L, H, d]) -> logits [1, V], self_cache
      (rows 2i and 2i+1 of a cache are layer i's keys and values). No tensor
      exceeds rank 4, so `steps.tflite` passes `check --target gpu`.
      The encoder output enters decode_step as its per-layer projected keys and
      values (`cross_cache`, computed once by `encode`), so a step never
      re-projects the source. `zoo.litert.StepModel` is the reference app loop.
"""

import contextlib
import json
import os
import sys

import numpy as np

from export.errors import ExportError
from export.kinds import (
    Endpoint,
    ExportKind,
    assert_ids_in_range,
    checked,
    cut_to,
    pad_empty,
)
from zoo.cli import UsageError

ALIASES = ("universal_transformer",)


class Seq2SeqKind(ExportKind):
    name = "seq2seq"
    id_signature = "translate_ids"
    # The served name of the tokens; the .tflite's greedy loop (zoo.lite) says "tokens".
    id_outputs = {"token_ids": "tokens"}
    expected = "a zoo seq2seq model"
    model_class = ("zoo.seq2seq.transformer", "Seq2SeqTransformer")

    def default_length(self, source):
        return int(self.model(source).max_source_length)

    def check_static(self, source, static_length):
        m = self.model(source)
        if static_length and static_length > m.max_source_length:
            raise UsageError(
                f"--length {static_length} exceeds max_source_length {m.max_source_length}"
            )

    # ------------------------------------------------------------ id level (greedy WHILE)
    def core_specs(self, source, static_length=None):
        import tensorflow as tf

        length = int(static_length or self.default_length(source))
        return [tf.TensorSpec([1, length], tf.int32, name="source_ids")]

    def core_fn(self, source, static=False):
        from zoo.seq2seq import decoding

        m = self.model(source)

        def fn(source_ids):
            return {"tokens": decoding.greedy(m, source_ids)}

        return fn

    # ------------------------------------------------------------ serving
    def serving_endpoints(self, source):
        import tensorflow as tf

        from zoo.seq2seq import decoding

        m = self.model(source)
        tok = m.tokenizer
        limit = int(m.max_source_length)
        length = int(m.max_target_length)
        vocabulary = int(m.vocabulary_size)

        def at_most_limit(size, what):
            return tf.debugging.assert_less_equal(
                size, limit, message=f"{what} than max_source_length ({limit})"
            )

        def translate(text):
            # An empty batch runs as one "" row and is cut back (pad_empty says why).
            ids, counts = tok.encode_tf(pad_empty(text), limit)
            ids = checked(ids, at_most_limit(counts, "an input has more tokens"))
            out = decoding.greedy(m, ids)
            return cut_to({"translation": tok.decode_tf(out), "token_ids": out}, tf.size(text))

        def translate_ids(source_ids):
            source_ids = checked(
                source_ids, at_most_limit(tf.shape(source_ids)[1], "source_ids has more positions")
            )
            source_ids = assert_ids_in_range(source_ids, vocabulary, "source_ids")
            out = decoding.greedy(m, pad_empty(source_ids, axes=(0, 1)))
            return cut_to({"token_ids": out}, tf.shape(source_ids)[0])

        step_encode, step_decode, specs = step_functions(m)

        def encode(source_ids):
            return step_encode(assert_ids_in_range(source_ids, vocabulary, "source_ids"))

        def decode_step(token, position, cross_cache, encoder_mask, self_cache):
            token = assert_ids_in_range(token, vocabulary, "token")
            # A position past the cache would write nowhere and read stale keys.
            position = assert_ids_in_range(
                position, length, "position", "the self_cache length (max_target_length)", False
            )
            return step_decode(token, position, cross_cache, encoder_mask, self_cache)

        texts = self._example_texts(source)
        ids = np.zeros((len(texts), limit), "int32")
        for i, row in enumerate(tok.encode(texts)):
            ids[i, : min(limit, len(row))] = row[:limit]
        # The step signatures are steps.tflite's functions (source_ids [1, S], S =
        # max_source_length), so a client can run beam search or sampling itself.
        source_row = ids[:1].copy()
        step_example = first_step(encode(tf.constant(source_row)), specs["decode_step"][4].shape)
        ids = ids[:, : max(1, int((ids > 0).sum(axis=1).max()))]
        text_spec = [tf.TensorSpec([None], tf.string, name="text")]
        return [
            *(
                Endpoint(
                    name,
                    translate,
                    text_spec,
                    {"text": texts},
                    "raw text -> translation (greedy, tokenizer inside)",
                )
                for name in ("serving_default", "translate")
            ),
            Endpoint(
                "translate_ids",
                translate_ids,
                [tf.TensorSpec([None, None], tf.int32, name="source_ids")],
                {"source_ids": ids},
                "SentencePiece ids (0-padded) -> output ids (EOS then 0)",
            ),
            Endpoint(
                "encode",
                encode,
                specs["encode"],
                {"source_ids": source_row},
                "steps.tflite's encode: source ids [1, S] -> cross_cache, encoder_mask",
            ),
            Endpoint(
                "decode_step",
                decode_step,
                specs["decode_step"],
                step_example,
                "steps.tflite's decode_step: one token -> logits [1, V], self_cache",
            ),
        ]

    def resources(self, source):
        # The core-op tokenizer's lookup tables.
        return [self.model(source).tokenizer.graph_tokenizer()]

    def _example_texts(self, source, n=3):
        examples = source.metrics().get("test_examples") or []
        texts = [e["source"] for e in examples[:n] if e.get("source")]
        if texts:
            return texts
        m = self.model(source)
        calib = source.calibration()
        if calib is not None and "source_ids" in calib:
            texts = [t for t in m.tokenizer.decode(calib["source_ids"][:n].tolist()) if t]
        return texts or ["hello"]

    def sidecar(self, source, static_length=None):
        m = self.model(source)
        # The SentencePiece model itself (base64), so an app or `zoo.load` can
        # tokenize text exactly as training did; `pieces` alone cannot.
        return {
            "kind": self.name,
            "tokenizer": m.tokenizer_proto,
            "pieces": m.tokenizer.pieces(),
            "pad_id": 0,
            "unk_id": 1,
            "bos_id": 2,
            "eos_id": 3,
            "max_source_length": int(static_length or m.max_source_length),
            "max_target_length": int(m.max_target_length),
        }

    # ------------------------------------------------------------ bundle
    intended_use = (
        "Text-to-text generation (translation or the algorithmic task it was trained on) "
        "for inputs like its training data (see data), decoded greedily or by beam search."
    )
    limitations = (
        "Inputs longer than max_source_length tokens are refused; outputs stop at "
        "max_target_length tokens; quality outside the training domain is unmeasured."
    )

    def bundle_extra_files(self, source):
        return {"tokenizer": ("spm.model", bytes(self.model(source).tokenizer.proto))}

    def preprocessing(self, source, refs):
        from sentencepiece import sentencepiece_model_pb2 as spm_pb2

        m = self.model(source)
        proto = spm_pb2.ModelProto.FromString(bytes(m.tokenizer.proto))
        tokenizer = {
            "type": "sentencepiece",
            "file": refs["tokenizer"],
            "encode": "SentencePieceProcessor(model_file=file).encode(text): ids, "
            "no BOS/EOS added (the model file holds the normalisation and the pieces)",
            # the trainer settings, for people reading the spec
            "model_type": spm_pb2.TrainerSpec.ModelType.Name(proto.trainer_spec.model_type).lower(),
            "normalization": proto.normalizer_spec.name,
            "add_dummy_prefix": bool(proto.normalizer_spec.add_dummy_prefix),
            "vocabulary_size": len(proto.pieces),
        }
        texts = self._example_texts(source) + ["A MAN, 42 dogs!", "  two  spaces ", ""]
        limit = int(m.max_source_length)
        return {
            "input": "one text (str)",
            "tokenizer": tokenizer,
            "special_ids": {"pad": 0, "unk": 1, "bos": 2, "eos": 3},
            "source_ids": {
                "max_length": limit,
                "layout": "int32 [1, max_length]: the text's ids, then pad ids",
                "longer": "refused (more ids than max_length)",
            },
            "decoding": {
                "start_id": 2,
                "stop_id": 3,
                "max_length": int(m.max_target_length),
                "default_length": "for a text of n ids: 2 * ceil8(n) + 10 rounded up to a "
                "multiple of 8 (ceil8(n): n rounded up to a multiple of 8, at least 8), "
                "at most max_length",
                "output_text": "cut the ids at the first stop_id, drop ids <= 2, then "
                "SentencePieceProcessor.decode",
            },
            "test_vectors": [
                {"text": t, "ids": ids} for t, ids in zip(texts, m.tokenizer.encode(texts))
            ],
        }


KIND = Seq2SeqKind()


# ---------------------------------------------------------------- step model
@contextlib.contextmanager
def _token_major_attention(model):
    """Traces self-attention in its token-major form (one `[T, C] x [C, 3Hd]`
    FULLY_CONNECTED, then a split) instead of the heads-first projection.

    The heads-first projection is a BATCH_MATMUL `[1, T, C+1] x [3H, C+1, d]`
    whose first operand's batch is broadcast; LiteRT's GPU accelerator turns it
    into a mat_mul_as_convolution of the wrong output shape and returns wrong
    values while reporting the model fully accelerated (measured: encode's
    cross_cache off by 3.4-7.8 on lavapipe and an H200; `python -m export check
    --target gpu` flags that BATCH_MATMUL). Both forms are the same arithmetic."""
    from layers import MultiHeadAttention

    found = [
        layer
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if isinstance(layer, MultiHeadAttention)
    ]
    for layer in found:
        layer._heads_first = lambda *args, **kwargs: False
    try:
        yield
    finally:
        for layer in found:
            del layer._heads_first


def step_functions(model):
    """(encode, decode_step, specs) with static-shape, rank-4 cache tensors.

    Caches travel as the layers' split form (a `[1, L, H, d]` key and value
    tensor per attention layer) concatenated on the batch axis, so no tensor
    in either graph exceeds rank 4 (the mobile GPU delegate's limit)."""
    import tensorflow as tf
    from keras import ops

    s = int(model.max_source_length)
    length = int(model.max_target_length)
    heads, head_dim = model.num_heads, model.head_dim
    n_self = model.num_self_caches
    n_cross = len(model.cross_caches(ops.zeros((1, 1, model.hidden_dim))))

    def pairs(flat, n):
        return tuple((flat[2 * i : 2 * i + 1], flat[2 * i + 1 : 2 * i + 2]) for i in range(n))

    def encode(source_ids):
        with _token_major_attention(model):
            encoder_output, mask = model.encode(source_ids)
        cross = model.cross_caches(encoder_output, split=True)
        return {
            "cross_cache": ops.concatenate([t for pair in cross for t in pair], axis=0),
            "encoder_mask": ops.cast(mask, "float32"),
        }

    def decode_step(token, position, cross_cache, encoder_mask, self_cache):
        logits, new = model.decode_step(
            token,
            position,
            pairs(self_cache, n_self),
            pairs(cross_cache, n_cross),
            encoder_mask > 0.5,
        )
        return {
            "logits": logits,
            "self_cache": ops.concatenate([t for pair in new for t in pair], axis=0),
        }

    specs = {
        "encode": [tf.TensorSpec([1, s], tf.int32, name="source_ids")],
        "decode_step": [
            tf.TensorSpec([1], tf.int32, name="token"),
            tf.TensorSpec([], tf.int32, name="position"),
            tf.TensorSpec([n_cross * 2, s, heads, head_dim], tf.float32, name="cross_cache"),
            tf.TensorSpec([1, s], tf.float32, name="encoder_mask"),
            tf.TensorSpec([n_self * 2, length, heads, head_dim], tf.float32, name="self_cache"),
        ],
    }
    return encode, decode_step, specs


def first_step(encoded, cache_shape):
    """decode_step's inputs for the first token after `encode`'s outputs `encoded`:
    BOS (2) at position 0 and an empty self_cache of `cache_shape`."""
    return {
        "token": np.array([2], np.int32),
        "position": np.array(0, np.int32),
        "cross_cache": np.asarray(encoded["cross_cache"]),
        "encoder_mask": np.asarray(encoded["encoder_mask"]),
        "self_cache": np.zeros(cache_shape, np.float32),
    }


def convert_steps(model):
    """The two-signature (encode, decode_step) TFLite model, builtin ops only."""
    from export import gpu_rewrite, tflite

    encode, decode_step, specs = step_functions(model)
    functions = {
        "encode": (encode, specs["encode"]),
        "decode_step": (decode_step, specs["decode_step"]),
    }
    # Low-rank elementwise operands reshaped for the GPU accelerator
    # (export/gpu_rewrite.py); the same arithmetic.
    return gpu_rewrite.legalize(tflite.from_functions(functions, [model]))


def export_all(run_dir, out_dir):
    """Writes OUT/steps.tflite, OUT/greedy.tflite, OUT/spm.model (the
    SentencePiece model), their sidecar OUT/seq2seq.tflite.json and the app bundle
    (export/bundle.py: preprocessing.json, model_card.json, MODEL_CARD.md);
    checks both against Keras greedy decoding on calibration rows first."""
    from export import bundle, rundir, tflite
    from export.check import check_model
    from zoo import atomic, litert
    from zoo.seq2seq import decoding
    from zoo.seq2seq.tokenization import cut

    src = rundir.resolve(run_dir)
    model = KIND.model(src)
    os.makedirs(out_dir, exist_ok=True)
    steps = convert_steps(model)
    greedy_bytes, specs = tflite.convert(src)
    rows = KIND.sample_inputs(src, 4, specs=specs)["source_ids"]
    report = {"checked_rows": int(len(rows))}
    # One traced graph for the rows (eagerly, the loop runs its Python body once per
    # token, seconds a row), proven on the first row to give the eager loop's tokens.
    keras_greedy = decoding.compiled(model, "greedy", jit_compile=False)
    eager = np.asarray(decoding.greedy(model, rows[:1]))
    if not np.array_equal(np.asarray(keras_greedy(rows[:1])), eager):
        raise ExportError("Keras greedy decoding differs traced and eager on row 0")
    # The app loop of docs/deploy.md, one decode_step call per token.
    app_loop = litert.StepModel.from_interpreter(litert.interpreter(steps))
    for i, row in enumerate(rows):
        # Tokens before EOS: the app loop and the WHILE loop.
        want = cut(np.asarray(keras_greedy(row[None]))[0])
        got_steps = cut(app_loop.greedy(row, model.max_target_length)[0])
        got_loop = cut(litert.run(greedy_bytes, {"source_ids": row[None]})["tokens"][0])
        if got_steps != want or got_loop != want:
            raise ExportError(
                f"row {i}: LiteRT tokens differ from Keras greedy "
                f"(steps {got_steps[:10]}, loop {got_loop[:10]}, keras {want[:10]})"
            )
    # The step model is the GPU mode; its verdict ships with it so an app
    # knows before trying the delegate.
    report["steps_gpu_problems"] = [str(p) for p in check_model(steps, "gpu")]
    sidecar = dict(
        KIND.sidecar(src),
        files={"steps": "steps.tflite", "greedy": "greedy.tflite"},
        source=os.path.abspath(src.path) if src.run_dir or os.path.exists(src.path) else None,
        parity=report,
        num_self_caches=int(model.num_self_caches),
        tokenizer_file="spm.model",
    )
    # The SentencePiece model as the file an app's tokenizer library opens (also
    # base64 in the sidecar's "tokenizer"), and the app bundle (export/bundle.py):
    # preprocessing.json (pointing to that spm.model), model_card.json, MODEL_CARD.md.
    files = {
        "steps.tflite": steps,
        "greedy.tflite": greedy_bytes,
        "spm.model": bytes(model.tokenizer.proto),
        litert.SEQ2SEQ_SIDECAR: json.dumps(sidecar, indent=2).encode(),
    }
    refs = {"tokenizer": "spm.model"}
    files.update(bundle.files(src, KIND, "tflite", list(files), parity=report, refs=refs))
    for name, content in files.items():
        atomic.write_bytes(os.path.join(out_dir, name), content)
    return {
        "steps": os.path.join(out_dir, "steps.tflite"),
        "greedy": os.path.join(out_dir, "greedy.tflite"),
        "steps_bytes": len(steps),
        "greedy_bytes": len(greedy_bytes),
        "steps_gpu_compatible": not report["steps_gpu_problems"],
    }


def main(argv=None):
    from zoo.cli import cli_boundary, command_parser

    parser = command_parser(
        "export.kinds.seq2seq",
        "seq2seq TFLite: steps.tflite (encode, decode_step) + greedy.tflite",
    )
    parser.add_argument("run_dir")
    parser.add_argument("--out", required=True, help="output directory")

    def body():
        args = parser.parse_args(argv)
        try:
            result = export_all(args.run_dir, args.out)
        except ExportError as e:
            print(f"export failed: {e}", file=sys.stderr)
            return 1
        print(json.dumps(result, indent=2))
        return 0

    return cli_boundary(body, argv)


if __name__ == "__main__":
    sys.exit(main())
