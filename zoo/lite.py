"""The zoo's task objects, and the TensorFlow-free client for its TFLite exports.

`zoo.lite.load(path)` runs what `python -m export tflite` and
`python -m export.kinds.seq2seq` write with `ai-edge-litert`, NumPy,
`sentencepiece` and Pillow only: it imports neither TensorFlow nor Keras (nor
`layers`, `train` or `export`), so it runs where they are not installed:
`pip install ./lite` installs it alone (docs/deploy.md, "Without TensorFlow").

`path` is a `.tflite` file with its sidecar (`FILE.tflite.json`; the one
`seq2seq.tflite.json` beside `steps.tflite` and `greedy.tflite`), or an export
folder holding one model (a folder written by `python -m export.kinds.seq2seq`,
or one `.tflite` file with its sidecar). The result is the object `zoo.load`
gives for the same file (`zoo.load` also loads run directories, `.keras` files
and SavedModels into these classes): a `TaggerTask`, `Translator` or
`ImageGenerator`, whose docstrings say what their methods take and return.

What every input gives (the same answer as the Keras model through
`zoo.load(run)`; tests/zoo/test_lite.py holds the cases and a property test):

- Text is any str. Characters the training data never had (other scripts,
  emoji, control characters) become the unknown id 1 (`<unk>`) on the way in;
  an `<unk>` the model emits is left out of the output text. A text that
  tokenizes to no ids (empty, whitespace only) translates to `""` (score 0.0)
  without running the model; a sentence with no tokens tags to `[]`.
- An empty batch gives an empty list; a batch gives what each of its inputs
  would give in it. A translation batch decodes as the Keras model batches
  it (inputs of similar length together, `zoo.litert.plan`): without
  `max_length`, a batch stops after `2 * ceil8(n) + 10` tokens for its longest
  input of n ids (at most the export's max_target_length).
- Refused with a `ValueError` that names the input and the limit: a text of
  more ids than the export's max_source_length, a sentence of more tokens than
  the tagger's length, an empty token in a token list, a value that is not a
  str, a str that is not valid Unicode (a lone surrogate), class ids outside
  [0, num_classes).

Thread safety: an object from `zoo.lite.load` runs one LiteRT interpreter,
which is not thread-safe; each object serialises its calls with a lock, so it
may be shared between threads (they take turns; load one object per thread to
run in parallel).
"""

import base64
import contextlib
import os
import re
import threading

import numpy as np

from zoo import litert
from zoo.cli import UsageError
from zoo.seq2seq import samplers

# Every tagger vocabulary starts with <pad>, <unk> (zoo.tagger.encoding).
TAGGER_PAD_ID, TAGGER_UNK_ID = 0, 1

SEQ2SEQ_KINDS = {"seq2seq", "universal_transformer"}


def same_kind(found, kind):
    """Whether a model of kind `found` serves a caller that needs `kind` (either
    seq2seq kind serves the other)."""
    return found == kind or {found, kind} <= SEQ2SEQ_KINDS


def load(path, kind=None):
    """Loads a `.tflite` file or an export folder (see the module docstring);
    `kind` (if given) is the sidecar kind the caller needs ("tagger", "seq2seq",
    "sagan")."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise UsageError(f"`path` does not exist. Received: path={path!r}")
    model_path, meta = resolve(path)
    found = meta.get("kind")
    if kind is not None and not same_kind(found, kind):
        raise UsageError(f"{litert.sidecar_path(model_path)}: kind is {found!r}, not {kind!r}")
    if found == "tagger":
        tagger = LiteTagger(model_path, meta)
        return TaggerTask(tagger, tags=list(tagger.tags), fmt="tflite")
    if found in SEQ2SEQ_KINDS:
        return _translator(model_path, meta)
    if found == "sagan":
        return tflite_image_generator(meta, litert.interpreter(model_path))
    raise UsageError(
        f"{model_path}: sidecar kind {found!r} is not one of 'tagger', 'seq2seq', 'sagan'"
    )


def is_export(path):
    """True for a `.tflite` file and for a folder that holds exports, not a run."""
    if path.endswith(".tflite"):
        return True
    if not os.path.isdir(path) or os.path.isfile(os.path.join(path, "model.keras")):
        return False
    from zoo.rundir import is_run_dir

    if is_run_dir(path):
        return False
    return any(n.endswith(".tflite") for n in os.listdir(path))


def read_json(path):
    from zoo.rundir import load_json

    data = load_json(path, "sidecar file ")
    if not isinstance(data, dict):
        raise UsageError(f"unreadable sidecar file {path}: not a JSON object")
    return data


def resolve(path):
    """(the .tflite file to run, its sidecar dict) for a file or an export folder."""
    if os.path.isdir(path):
        shared = litert.seq2seq_sidecar_path(path)
        if os.path.isfile(shared):
            meta = read_json(shared)
            files = meta.get("files") or {}
            for key in ("steps", "greedy"):
                if files.get(key) and os.path.isfile(os.path.join(path, files[key])):
                    return os.path.join(path, files[key]), meta
            raise UsageError(f"{shared} names no .tflite file present in {path}")
        found = sorted(
            n
            for n in os.listdir(path)
            if n.endswith(".tflite") and os.path.isfile(litert.sidecar_path(os.path.join(path, n)))
        )
        if len(found) != 1:
            raise UsageError(
                f"{path} must hold one .tflite file with its .json sidecar "
                f"(or {litert.SEQ2SEQ_SIDECAR}); found {found}"
            )
        path = os.path.join(path, found[0])
    if not path.endswith(".tflite"):
        raise UsageError(
            f"`path` must be a .tflite file or an export folder. Received: path={path!r}"
        )
    if os.path.isfile(litert.sidecar_path(path)):
        return path, read_json(litert.sidecar_path(path))
    shared = litert.seq2seq_sidecar_path(os.path.dirname(os.path.abspath(path)))
    if os.path.isfile(shared):
        meta = read_json(shared)
        if os.path.basename(path) in (meta.get("files") or {}).values():
            return path, meta
    raise UsageError(
        f"missing sidecar vocabulary file for the TFLite model: {litert.sidecar_path(path)} "
        f"(nor {litert.SEQ2SEQ_SIDECAR} naming it)"
    )


def _unicode(text, what):
    """Refuses a str that UTF-8 cannot encode (a lone surrogate), naming `what`."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{what} is not valid Unicode text (a lone surrogate at {e.start}): {text[:60]!r}"
        ) from None


def _texts(texts):
    """A str or a list of str -> (list, single); refuses anything else in our words."""
    single = isinstance(texts, str)
    items = [texts] if single else texts
    if not isinstance(items, (list, tuple)) or not all(isinstance(t, str) for t in items):
        raise ValueError(f"`texts` must be a str or a list of str. Received: {texts!r:.80}")
    for i, text in enumerate(items):
        _unicode(text, f"input {i}")
    return list(items), single


# ---------------------------------------------------------------- tagger
class LiteTagger:
    """A tagger `.tflite` (ids in, probabilities or tag ids out) run on tokens:
    `tagger(token_lists)` -> per sentence, (token, tag) pairs. The ids follow
    `zoo.tagger.encoding.TokenEncoder`'s rules: word id = index of the token
    lower-cased with every ASCII digit -> "0" (1, `<unk>`, if unknown); character
    ids = index of each character as written (1 if unknown), cut to `max_chars`,
    0-padded."""

    def __init__(self, path, meta):
        try:
            self.tags = list(meta["tags"])
            self.max_len = int(meta["max_len"])
            self.max_chars = int(meta["max_chars"])
            self._words = {w: i for i, w in enumerate(meta["words"]) if i >= 2}
            self._chars = {c: i for i, c in enumerate(meta["chars"]) if i >= 2}
        except (KeyError, TypeError, ValueError) as e:
            raise UsageError(
                f"bad sidecar file {litert.sidecar_path(path)}: {type(e).__name__}: {e}"
            ) from None
        self._runner, _ = litert.signature_runner(litert.interpreter(path))
        shape = self._runner.get_input_details()["word_ids"]["shape_signature"]
        self.static_length = int(shape[1]) if shape[1] > 0 else None

    def word_id(self, token):
        # TensorFlow's UTF-8 lower-casing (TokenEncoder's) ends a string at its first
        # NUL: "a\x00b" is the word "a" there, and "\x00b" the padding word "".
        key = token.split("\x00", 1)[0].lower()
        if key == "":
            return TAGGER_PAD_ID
        return self._words.get(re.sub("[0-9]", "0", key), TAGGER_UNK_ID)

    def char_ids(self, token):
        ids = [self._chars.get(c, TAGGER_UNK_ID) for c in token][: self.max_chars]
        return ids + [TAGGER_PAD_ID] * (self.max_chars - len(ids))

    def __call__(self, token_lists):
        limit = self.static_length or self.max_len
        for tokens in token_lists:
            if len(tokens) > limit:
                raise ValueError(
                    f"sentence has {len(tokens)} tokens, more than the model's {limit}"
                )
        results = []
        for tokens in token_lists:  # one at a time: a static export has batch 1
            padded = list(tokens) + [""] * ((self.static_length or len(tokens)) - len(tokens))
            out = self._runner(
                word_ids=np.array([[self.word_id(t) for t in padded]], np.int32),
                char_ids=np.array([[self.char_ids(t) for t in padded]], np.int32),
            )
            tag_ids = (
                out["tag_ids"][0] if "tag_ids" in out else np.argmax(out["probabilities"][0], -1)
            )
            results.append([(t, self.tags[int(i)]) for t, i in zip(tokens, tag_ids)])
        return results


class _Task:
    """What every task holds: its `format` ("keras", "savedmodel" or "tflite")
    and the loaded `model`. A "tflite" task runs its calls one at a time (a
    LiteRT interpreter serves one call at a time)."""

    def __init__(self, fmt, model):
        self.format = fmt
        self.model = model
        self._lock = threading.Lock() if fmt == "tflite" else contextlib.nullcontext()

    def _locked(self, fn, *args, **kwargs):
        with self._lock:
            return fn(*args, **kwargs)


class TaggerTask(_Task):
    """Part-of-speech tagging. `tag(sentences)`: a str (one sentence, split on
    whitespace), or a list of str / token lists -> per sentence, a list of
    (token, tag) pairs; a sentence without tokens gives `[]`."""

    kind = "tagger"

    def __init__(self, tag_tokens, tags, fmt, model=None):
        super().__init__(fmt, model)
        self._tag_tokens = tag_tokens
        self.tags = tags

    def tag(self, sentences):
        if isinstance(sentences, str):
            sentences = [sentences]
        if not isinstance(sentences, (list, tuple)):
            raise ValueError(
                "`sentences` must be a str or a list of str / token lists. "
                f"Received: {sentences!r:.80}"
            )
        token_lists = []
        for i, s in enumerate(sentences):
            if isinstance(s, str):
                _unicode(s, f"sentence {i}")
                token_lists.append(s.split())
                continue
            if not isinstance(s, (list, tuple)) or not all(isinstance(t, str) for t in s):
                raise ValueError(
                    f"sentence {i} must be a str or a list of str tokens. Received: {s!r:.80}"
                )
            for t in s:
                _unicode(t, f"a token of sentence {i}")
            if any(not t or t.isspace() for t in s):
                raise ValueError(f"sentence {i} has an empty token. Received: {s!r:.80}")
            token_lists.append(list(s))
        if not any(token_lists):
            return [[] for _ in token_lists]
        filled = [tokens for tokens in token_lists if tokens]
        tagged = iter(self._locked(self._tag_tokens, filled))
        return [next(tagged) if tokens else [] for tokens in token_lists]

    def __repr__(self):
        return f"<TaggerTask format={self.format!r}>"


# ---------------------------------------------------------------- translator
def _translator(path, meta):
    """A translator over a seq2seq .tflite file: the step model (`encode`,
    `decode_step`; every sampler, the loop run here as an app would) or the
    one-file WHILE model (`source_ids` -> `tokens`; greedy only)."""
    from zoo.seq2seq.tokenization import Tokenizer, cut

    # Every export writes the SentencePiece model into the sidecar (base64); the
    # spm.model beside it holds the same bytes, for an app's tokenizer library.
    if not meta.get("tokenizer"):
        raise UsageError(f"{path}: no tokenizer in its sidecar; re-export")
    tokenizer = Tokenizer(base64.b64decode(meta["tokenizer"]))
    interpreter = litert.interpreter(path)
    kind = meta.get("kind", "seq2seq")
    signatures = interpreter.get_signature_list()
    if "decode_step" in signatures:
        steps = litert.StepModel.from_interpreter(interpreter)
        return Translator(steps.generate_ids, tokenizer, steps.max_source_length, "tflite", kind)
    runner = interpreter.get_signature_runner(sorted(signatures)[0])
    length = int(runner.get_input_details()["source_ids"]["shape"][1])

    def greedy(ids, sampler, n, max_length=None, seed=None, with_scores=True):
        outs = []
        for row in ids:
            source = np.zeros((1, length), np.int32)
            source[0, : len(row)] = row
            outs.append(runner(source_ids=source)["tokens"][0].tolist())
        found = [None] * len(ids)
        # The graph decodes to its max_target_length: cut at the batch's limit.
        for chunk, _, _, limit in litert.plan([len(row) for row in ids], len(outs[0])):
            for i in chunk:
                found[i] = [(cut(outs[i][:limit]), 0.0)]
        return found

    return Translator(
        greedy,
        tokenizer,
        length,
        "tflite",
        kind,
        greedy_only=f"{os.path.basename(path)} decodes greedily inside one WHILE op "
        "(the step model steps.tflite, written next to it by "
        "`python -m export.kinds.seq2seq`, runs every sampler)",
    )


class Translator(_Task):
    """Text to text. `generate(texts, sampler="greedy", num_return_sequences=1,
    return_scores=False, max_length=None, seed=None)`: see
    `Seq2SeqTransformer.generate`; the same samplers, scores and seeded draws
    from a Keras file, from `steps.tflite` and from a SavedModel (their
    `encode` / `decode_step` signatures driven by `zoo.litert.StepModel`;
    outputs equal Keras's up to float rounding). A one-file `greedy.tflite`
    decodes greedily inside its graph: other samplers, scores and `max_length`
    raise `ValueError` naming the sampler and the format.
    `translate(texts, beam_width=1, alpha=0.6, max_length=None)`: greedy, or the
    best of a beam search, as strings. See the module docstring for what each
    input gives.

    Args:
        generate_ids: `(ids, sampler, n, max_length=, seed=, with_scores=)` -> per
            input, n (ids, score) pairs (`zoo.seq2seq.decoding.generate_ids`'s contract).
        tokenizer: a `zoo.seq2seq.tokenization.Tokenizer`.
        max_source_length: the most ids an input may have.
        greedy_only: for a graph that decodes greedily only, what the refusal
            of other samplers says about it.
    """

    def __init__(
        self,
        generate_ids,
        tokenizer,
        max_source_length,
        fmt="keras",
        kind="seq2seq",
        model=None,
        greedy_only=None,
    ):
        super().__init__(fmt, model)
        self._generate_ids = generate_ids
        self._tokenizer = tokenizer
        self.max_source_length = max_source_length
        self.kind = kind
        self._greedy_only = greedy_only

    # Seq2SeqTransformer.generate's arguments (KerasHub's convention): one call for every format.
    def generate(
        self,
        texts,
        sampler="greedy",
        num_return_sequences=1,
        return_scores=False,
        max_length=None,
        seed=None,
    ):
        picked = samplers.get(sampler)
        texts, single = _texts(texts)
        greedy_one = isinstance(picked, samplers.Greedy) and num_return_sequences == 1
        if self._greedy_only and (not greedy_one or return_scores or max_length is not None):
            raise ValueError(
                f"{self._greedy_only}: only sampler='greedy' with one sequence, no "
                "scores and the default length; load the run directory (or steps.tflite) "
                f"for sampler={sampler!r}. Received: sampler={sampler!r}, "
                f"format={self.format!r}, num_return_sequences={num_return_sequences}, "
                f"return_scores={return_scores}, max_length={max_length}"
            )
        # (text, score) pairs go back, else the best text alone: scores unseen are not computed.
        scored = return_scores or num_return_sequences != 1
        ids = self._tokenizer.encode_within(texts, self.max_source_length)
        todo = [i for i, row in enumerate(ids) if row]
        found = [[("", 0.0)] * num_return_sequences for _ in ids]
        if todo:
            done = self._locked(
                self._generate_ids,
                [ids[i] for i in todo],
                picked,
                num_return_sequences,
                max_length=max_length,
                seed=seed,
                with_scores=scored,
            )
            for i, row in zip(todo, done):
                decoded = self._tokenizer.decode([c[0] for c in row])
                found[i] = [(text, score) for text, (_, score) in zip(decoded, row)]
        out = [row if scored else row[0][0] for row in found]
        return out[0] if single else out

    def translate(self, texts, beam_width=1, alpha=0.6, max_length=None):
        """str or list of str -> str or list of str: greedy, or the best of a beam
        search of `beam_width` with length penalty `alpha`."""
        if beam_width == 1 and not isinstance(beam_width, bool):
            return self.generate(texts, max_length=max_length)
        return self.generate(texts, sampler=samplers.Beam(beam_width, alpha), max_length=max_length)

    def __repr__(self):
        return f"<Translator kind={self.kind!r} format={self.format!r}>"


# ---------------------------------------------------------------- generator
def tflite_image_generator(meta, interpreter):
    """An `ImageGenerator` over a SAGAN generator `.tflite` (its LiteRT `interpreter`
    and sidecar `meta`). A static batch-1 file runs one image at a time (`litert.call`)."""
    try:
        runner = interpreter.get_signature_runner(meta.get("signature", "serving_default"))
        latent_dim = int(meta["latent_dim"])
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"bad SAGAN sidecar: {type(e).__name__}: {e}") from None
    conditional = bool(meta.get("num_classes"))

    def run(noise, labels):
        feed = {"noise": noise, "label": labels} if conditional else {"noise": noise}
        return litert.call(runner, feed)["image"]

    return ImageGenerator(
        run,
        latent_dim,
        meta.get("num_classes"),
        meta.get("class_names") or [],
        fmt="tflite",
    )


class ImageGenerator(_Task):
    """Class-conditional (or unconditional) image generation.
    `generate(class_ids=None, seed=None, num_images=None)` -> float32 images
    `[N, S, S, C]` in [0, 1]. `class_ids`: ids or class names (conditional
    generators); `num_images`: how many (unconditional ones). The noise is
    `numpy.random.default_rng(seed).standard_normal((N, latent_dim))`."""

    kind = "sagan"

    def __init__(
        self,
        run,
        latent_dim,
        num_classes,
        class_names,
        fmt,
        model=None,
        conditional=None,
    ):
        super().__init__(fmt, model)
        self._run = run
        self.latent_dim = latent_dim
        self.num_classes = num_classes
        self.class_names = list(class_names)
        self.conditional = bool(num_classes) if conditional is None else conditional

    def _ids(self, class_ids):
        ids = []
        for value in class_ids:
            if isinstance(value, str):
                if value not in self.class_names:
                    raise ValueError(
                        f"`class_ids` names an unknown class; known: {self.class_names}. "
                        f"Received: {value!r}"
                    )
                value = self.class_names.index(value)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, np.integer))
                or value < 0
                or (self.num_classes and value >= self.num_classes)
            ):
                bound = f"[0, {self.num_classes})" if self.num_classes else ">= 0"
                raise ValueError(
                    f"`class_ids` must hold ints in {bound} or class names. Received: {value!r}"
                )
            ids.append(int(value))
        return np.asarray(ids, np.int32)

    def generate(self, class_ids=None, seed=None, num_images=None):
        if self.conditional:
            if class_ids is None or num_images is not None:
                raise ValueError(
                    "a class-conditional generator takes `class_ids` (not `num_images`). "
                    f"Received: class_ids={class_ids!r}, num_images={num_images!r}"
                )
            labels = self._ids(
                [class_ids] if isinstance(class_ids, (int, str, np.integer)) else class_ids
            )
        else:
            if class_ids is not None:
                raise ValueError(
                    f"this generator is unconditional: pass `num_images`, not "
                    f"`class_ids`. Received: class_ids={class_ids!r}"
                )
            labels = np.zeros(samplers.positive_int("num_images", num_images), np.int32)
        if len(labels) == 0:
            raise ValueError("`class_ids` is empty")
        noise = (
            np.random.default_rng(seed)
            .standard_normal((len(labels), self.latent_dim))
            .astype(np.float32)
        )
        return self.images(noise, labels)

    def images(self, noise, labels):
        """The images for this `noise` `[N, latent_dim]` and these class ids `[N]`
        (ignored by an unconditional generator): float32 `[N, S, S, C]` in [0, 1]."""
        return np.asarray(self._locked(self._run, noise, labels), np.float32)

    def __repr__(self):
        return f"<ImageGenerator format={self.format!r} num_classes={self.num_classes}>"
