"""Running exported models with LiteRT and NumPy only (no TensorFlow): the
interpreter behind one file check, signature runners, comparisons, the sidecar
names, and `StepModel`, the one decoder of the exported `encode` / `decode_step`
signatures (`steps.tflite`'s, a SavedModel's, LiteRT's GPU accelerator's).

`StepModel` decodes as `zoo.seq2seq.decoding` decodes a Keras model (greedy,
beam search with n-best, seeded sampling, the same scores), one `decode_step`
call per token and live row, as an app does; `plan` is the batching and length
rule both follow, so a batch gets the Keras model's tokens."""

import os

import numpy as np

from zoo.seq2seq import samplers
from zoo.seq2seq.tokenization import BOS_ID, EOS_ID, PAD_ID, cut

# Beside FILE.tflite: FILE.tflite.json (`sidecar_path`); beside the two files of
# `python -m export.kinds.seq2seq`: one sidecar for both.
SIDECAR_SUFFIX = ".json"
SEQ2SEQ_SIDECAR = "seq2seq.tflite.json"
NEG = np.float32(-1e9)


def sidecar_path(tflite_path):
    """FILE.tflite -> FILE.tflite.json."""
    return os.fspath(tflite_path) + SIDECAR_SUFFIX


def seq2seq_sidecar_path(folder):
    return os.path.join(folder, SEQ2SEQ_SIDECAR)


def interpreter(model, threads=None):
    """An ai_edge_litert Interpreter from a path or the model's bytes."""
    from ai_edge_litert.interpreter import Interpreter

    kwargs = {"num_threads": threads} if threads else {}
    if isinstance(model, (bytes, bytearray)):
        return Interpreter(model_content=bytes(model), **kwargs)
    check_tflite_file(str(model))
    try:
        return Interpreter(model_path=str(model), **kwargs)
    except (ValueError, RuntimeError) as e:
        from zoo.cli import UsageError

        raise UsageError(
            f"cannot load .tflite file {model}: {' '.join(str(e).split())[:200]}"
        ) from None


def check_tflite_file(path):
    # LiteRT answers a truncated or foreign file with a multi-line error (or worse).
    from zoo.cli import UsageError

    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise UsageError(f"cannot read .tflite file {path}: {e.strerror}") from None
    if len(head) < 8 or head[4:8] != b"TFL3":
        raise UsageError(
            f"not a TFLite model (no TFL3 identifier; truncated or corrupted?): {path}"
        )


def signature_runner(interp, signature=None):
    signatures = interp.get_signature_list()
    if not signatures:
        raise ValueError("the .tflite model has no signatures")
    if signature is None:
        signature = "serving_default" if "serving_default" in signatures else sorted(signatures)[0]
    return interp.get_signature_runner(signature), signature


def run(model, inputs, signature=None):
    """Runs `inputs` through the model's `signature` (see `call`)."""
    return call(signature_runner(interpreter(model), signature)[0], inputs)


def call(runner, inputs):
    """Runs `inputs` (dict name -> array with a batch axis) through a LiteRT
    signature runner. A static batch-1 model runs row by row; a dynamic one runs
    the batch at once. Returns a dict name -> array with the batch axis of `inputs`.
    """
    details = runner.get_input_details()
    batch = len(next(iter(inputs.values())))
    static_one = all(
        list(d.get("shape_signature", d["shape"]))[:1] == [1] for d in details.values()
    )
    if static_one and batch != 1:
        parts = [
            runner(**{k: np.asarray(v[i : i + 1]) for k, v in inputs.items()}) for i in range(batch)
        ]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return {
        k: np.asarray(v) for k, v in runner(**{k: np.asarray(v) for k, v in inputs.items()}).items()
    }


def compare(reference, candidate, mask=None, class_output=None):
    """Compares every reference output with the candidate's, failing closed.

    Args:
        reference, candidate: dict name -> array (same shapes).
        mask: optional bool array over the leading axes ([B, T]) of positions
            that count (padding is excluded).
        class_output: name of the output whose last axis holds class scores.

    Returns:
        {"max_abs_diff": {float output: max abs diff (inf where only one side
        is finite)}, "equal_fraction": {integer output: share of equal values},
        "agreement": argmax agreement on `class_output` (None without one),
        "problems": what makes the comparison void: no reference outputs, an
        output missing or of another shape, no position compared, a non-finite
        reference}. A verdict passes only with no problems.
    """
    report = {"max_abs_diff": {}, "equal_fraction": {}, "agreement": None, "problems": []}
    problems = report["problems"]
    if not reference:
        problems.append("no reference outputs to compare")

    def counted(values):
        if (
            mask is not None
            and values.ndim >= mask.ndim
            and values.shape[: mask.ndim] == mask.shape
        ):
            return values[mask]
        return values

    for name, ref in reference.items():
        if name not in candidate:
            problems.append(f"output {name!r} is missing (has {sorted(candidate)})")
            continue
        a, b = np.asarray(ref), np.asarray(candidate[name])
        if a.shape != b.shape:
            problems.append(
                f"output {name!r}: shape {list(b.shape)} != the reference's {list(a.shape)}"
            )
            continue
        if not counted(np.ones(a.shape, bool)).size:
            problems.append(f"output {name!r}: no position to compare")
            continue
        if not np.issubdtype(a.dtype, np.floating):
            report["equal_fraction"][name] = float(counted(a == b).mean())
            continue
        a, b = a.astype(np.float64), b.astype(np.float64)
        if not np.isfinite(counted(a)).all():
            problems.append(f"output {name!r}: the reference holds NaN or inf")
        diff = counted(np.where(np.isfinite(a) & np.isfinite(b), np.abs(a - b), np.inf))
        report["max_abs_diff"][name] = float(diff.max())
    if class_output and class_output in candidate and class_output in reference:
        ref, got = np.asarray(reference[class_output]), np.asarray(candidate[class_output])
        if ref.shape == got.shape and ref.size:
            same = np.argmax(ref, axis=-1) == np.argmax(got, axis=-1)
            same &= np.isfinite(got).all(axis=-1)  # a NaN row's argmax agrees with nothing
            same = counted(same)
            report["agreement"] = float(same.mean()) if same.size else None
    return report


def gate(report, max_abs_diff, min_agreement, by_agreement=False):
    """Why `compare`'s report fails the gates ([] = it passes): every output
    compared, float outputs within `max_abs_diff` (unless `by_agreement` and the
    class output's agreement speaks for them), integer outputs and the class
    output agreeing on at least `min_agreement` of the positions."""
    why = list(report["problems"])
    by_agreement = by_agreement and report["agreement"] is not None
    for name, diff in report["max_abs_diff"].items():
        if not by_agreement and not diff <= max_abs_diff:
            why.append(f"output {name!r} differs by {diff:.3g} > {max_abs_diff:g}")
    for name, share in report["equal_fraction"].items():
        if not share >= min_agreement:
            why.append(f"output {name!r} equal on {share:.1%} < {min_agreement:.1%}")
    if report["agreement"] is not None and not report["agreement"] >= min_agreement:
        why.append(f"argmax agrees on {report['agreement']:.1%} < {min_agreement:.1%}")
    return why


# ---------------------------------------------------------------- step decoding
def bucket(length, step=8):
    """`length` rounded up to a multiple of `step` (at least `step`)."""
    return max(step, -(-length // step) * step)


def plan(lengths, max_target_length, max_length=None, batch_size=64):
    """How sources of these `lengths` decode, for Keras models and exported steps
    alike: yields (input indices, padded width, rows, output limit) per batch.
    Inputs go in order of length, `batch_size` at a time; a batch's sources are
    padded to a multiple of 8 (`width`), and without `max_length` it stops after
    `2 * width + 10` tokens (rounded up to 8, at most `max_target_length`), as
    fairseq's max_len_a/max_len_b do."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        width = bucket(max(1, max(lengths[i] for i in chunk)))
        rows = batch_size if len(order) > batch_size else len(chunk)
        limit = max_length or min(int(max_target_length), bucket(2 * width + 10))
        yield chunk, width, rows, limit


def log_softmax(logits):
    logits = np.asarray(logits, np.float32)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def length_penalty(length, alpha):
    """GNMT's `((5 + length) / 6) ** alpha`, in float32 as the Keras loop computes it."""
    return np.power(np.float32((5.0 + np.float32(length)) / np.float32(6.0)), np.float32(alpha))


def _top_k(values, k):
    """(values, indices) of the k largest, ties to the lower index (tf.math.top_k's order)."""
    order = np.argsort(-values, kind="stable")[:k]
    return values[order], order


def filter_logits(logits, temperature=1.0, top_k=None, top_p=None):
    """`zoo.seq2seq.decoding.filter_logits` in NumPy: logits `[B, V]` / temperature,
    then everything outside the top k, then outside the nucleus `top_p`, set to -1e9."""
    logits = np.asarray(logits, np.float32) / np.float32(temperature)
    vocab = logits.shape[-1]
    if top_k is not None and top_k < vocab:
        kth = -np.sort(-logits, axis=-1)[:, top_k - 1 : top_k]
        logits = np.where(logits < kth, NEG, logits)
    if top_p is not None and top_p < 1:
        ranked = -np.sort(-logits, axis=-1)
        e = np.exp(ranked - ranked.max(axis=-1, keepdims=True))
        probs = e / e.sum(axis=-1, keepdims=True)
        before = np.cumsum(probs, axis=-1) - probs
        kept = np.where(before < np.float32(top_p), ranked, np.float32(np.inf))
        logits = np.where(logits < kept.min(axis=-1, keepdims=True), NEG, logits)
    return logits


def uniform(seed, step, row, size):
    """`zoo.seq2seq.decoding._uniform`'s counter hash of (seed, step, row, column) for
    one row: the same integer ops, so the same float32 draws as the Keras loop."""
    with np.errstate(over="ignore"):
        x = (
            np.uint32(seed) * np.uint32(0x9E3779B1)
            + np.uint32(step) * np.uint32(0x85EBCA77)
            + np.uint32(row) * np.uint32(0xC2B2AE3D)
            + np.arange(size, dtype=np.uint32) * np.uint32(0x27D4EB2F)
        )
        for _ in range(2):
            x = x ^ (x >> np.uint32(16))
            x = x * np.uint32(0x85EBCA6B)
            x = x ^ (x >> np.uint32(13))
            x = x * np.uint32(0xC2B2AE35)
            x = x ^ (x >> np.uint32(16))
    return ((x >> np.uint32(8)).astype(np.float32) + np.float32(0.5)) * np.float32(1.0 / 2**24)


class StepModel:
    """The exported `encode` / `decode_step` signatures, decoded in NumPy.

    `encode(source_ids [1, S]) -> cross_cache, encoder_mask` runs once per input;
    `decode_step(token [1], position [], cross_cache, encoder_mask, self_cache)
    -> logits [1, V], self_cache` once per output token (and live beam). This is
    the loop an app writes (docs/deploy.md); `zoo.lite`, `zoo.load` (steps.tflite
    and a SavedModel's step signatures) and the exports' reference checks run it.

    Args:
        encode, step: callables taking the signatures' inputs as NumPy keyword
            arguments and returning a dict of arrays (a LiteRT signature runner).
        source_length: S; cache_shape: decode_step's `self_cache` shape
            `[2N, L, H, d]` (L, the exported max_target_length, bounds every
            output); vocabulary_size: V.
    """

    def __init__(self, encode, step, source_length, cache_shape, vocabulary_size):
        self._encode, self._step = encode, step
        self.max_source_length = int(source_length)
        self.cache_shape = tuple(int(d) for d in cache_shape)
        self.max_target_length = self.cache_shape[1]
        self.vocabulary_size = int(vocabulary_size)

    @classmethod
    def from_interpreter(cls, interp):
        encode = interp.get_signature_runner("encode")
        step = interp.get_signature_runner("decode_step")
        return cls(
            encode,
            step,
            encode.get_input_details()["source_ids"]["shape"][1],
            step.get_input_details()["self_cache"]["shape"],
            step.get_output_details()["logits"]["shape"][-1],
        )

    def encode(self, ids):
        """One source: its ids (at most S, or a 0-padded row) -> encode's outputs."""
        ids = np.asarray(ids).reshape(-1)
        s, vocab = self.max_source_length, self.vocabulary_size
        if ids.size and (
            not np.issubdtype(ids.dtype, np.integer) or ids.min() < 0 or ids.max() >= vocab
        ):
            raise ValueError(
                f"source ids must be ints in [0, {vocab}) (the vocabulary). Received: {ids.tolist()[:20]}"
            )
        ids = ids.astype(np.int32)
        if len(ids) > s and ids[s:].any():
            raise ValueError(f"a source has {len(ids)} tokens, more than the model's {s}")
        row = np.zeros((1, s), np.int32)
        row[0, : min(s, len(ids))] = ids[:s]
        return self._encode(source_ids=row)

    def step(self, token, position, encoded, cache):
        """One decode_step: (logits float32 [V], the new self_cache)."""
        out = self._step(
            token=np.array([token], np.int32),
            position=np.array(position, np.int32),
            cross_cache=encoded["cross_cache"],
            encoder_mask=encoded["encoder_mask"],
            self_cache=cache,
        )
        return np.asarray(out["logits"], np.float32).reshape(-1), out["self_cache"]

    def _decode(self, ids, limit, pick, margins=None):
        """One token per step, `pick(logits, step) -> id`, until EOS or `limit` tokens:
        (the ids, EOS included when produced; their log-probability, PAD ids left
        out as `zoo.seq2seq.decoding.sequence_log_probability` leaves them out)."""
        encoded = self.encode(ids)
        cache = np.zeros(self.cache_shape, np.float32)
        token, out, score = BOS_ID, [], np.float32(0.0)
        for position in range(limit):
            logits, cache = self.step(token, position, encoded, cache)
            token = int(pick(logits, position))
            if margins is not None:  # how near a tie the choice was
                top = np.sort(logits.astype(np.float64))[-2:]
                margins.append(float(top[1] - top[0]))
            if token != PAD_ID:
                score += log_softmax(logits)[token]
            out.append(token)
            if token == EOS_ID:
                break
        return out, float(score)

    def greedy(self, ids, limit, margins=None):
        """Greedy decoding of one source (the first maximum, as argmax): (ids, score)."""
        return self._decode(ids, limit, lambda logits, i: np.argmax(logits), margins)

    def sample(self, ids, limit, seed, row, sampler):
        """One seeded draw (`zoo.seq2seq.samplers.Sampling`), the Keras loop's draw for
        row `row` of a batch decoded with `seed`: (ids, score)."""
        never = np.zeros(self.vocabulary_size, bool)
        never[[PAD_ID, BOS_ID]] = True

        def pick(logits, i):
            logits = filter_logits(
                np.where(never, NEG, logits)[None],
                sampler.temperature,
                sampler.top_k,
                sampler.top_p,
            )[0]
            return np.argmax(logits - np.log(-np.log(uniform(seed, i, row, len(logits)))))

        return self._decode(ids, limit, pick)

    def beam(self, ids, width, alpha, limit):
        """Beam search of one source, as `zoo.seq2seq.decoding.beam_candidates` ranks
        and stops: [(ids, score)], the finished hypotheses best first (score
        `log p / length_penalty`), then the `width` live ones (normalised at `limit`)."""
        k, vocab = int(width), self.vocabulary_size
        encoded = self.encode(ids)
        caches = np.zeros((k, *self.cache_shape), np.float32)
        alive_logp = np.full(k, NEG, np.float32)
        alive_logp[0] = 0.0
        alive_seq = np.zeros((k, limit), np.int32)
        finished_seq = np.zeros((k, limit), np.int32)
        finished_score = np.full(k, NEG, np.float32)
        current = np.full(k, BOS_ID, np.int32)
        rank = np.arange(2 * k)
        for i in range(limit):
            logits = np.zeros((k, vocab), np.float32)
            new_caches = caches.copy()
            for r in range(k):
                if alive_logp[r] > NEG / 2:  # an empty slot is never among the 2k best
                    logits[r], new_caches[r] = self.step(int(current[r]), i, encoded, caches[r])
            scores = (alive_logp[:, None] + log_softmax(logits)).reshape(-1)
            top_logp, top_index = _top_k(scores, 2 * k)
            from_beam, token = top_index // vocab, (top_index % vocab).astype(np.int32)
            candidates = alive_seq[from_beam].copy()
            candidates[:, i] = token
            is_eos = token == EOS_ID
            live_logp, order = _top_k(np.where(is_eos, NEG, top_logp).astype(np.float32), k)
            alive_seq, caches, current = (
                candidates[order],
                new_caches[from_beam[order]],
                token[order],
            )
            alive_logp = live_logp
            penalty = length_penalty(i + 1, alpha)
            eos_score = np.where(is_eos & (rank < k), top_logp / penalty, NEG).astype(np.float32)
            finished_score, order2 = _top_k(np.concatenate([finished_score, eos_score]), k)
            finished_seq = np.concatenate([finished_seq, candidates])[order2]
            if finished_score[k - 1] >= live_logp[0] / penalty:
                break
        found = [(s, v) for s, v in zip(finished_seq, finished_score) if v > NEG / 2]
        found += list(zip(alive_seq, alive_logp / length_penalty(limit, alpha)))
        return [(cut(s), float(v)) for s, v in found]

    def generate_ids(
        self, ids, sampler, num_return_sequences=1, max_length=None, seed=None, with_scores=True
    ):
        """`zoo.seq2seq.decoding.generate_ids` on the exported steps: list of id lists
        -> per input, `num_return_sequences` (ids, score) pairs (ids cut at EOS); the
        same batches, limits and seeds, so the Keras model's tokens. The scores come
        with the loop, so `with_scores` changes nothing here."""
        n = samplers.check_request(sampler, num_return_sequences)
        if max_length is not None:
            max_length = samplers.positive_int("max_length", max_length)
            if max_length > self.max_target_length:
                raise ValueError(
                    "`max_length` exceeds the export's max_target_length "
                    f"({self.max_target_length}). Received: max_length={max_length}"
                )
        if isinstance(sampler, samplers.Beam) and 2 * sampler.width > self.vocabulary_size:
            raise ValueError(
                f"`width` must be at most half the vocabulary ({self.vocabulary_size}). "
                f"Received: width={sampler.width}"
            )
        # Sampling decodes each input n times (independent draws); the others once.
        draws = n if isinstance(sampler, samplers.Sampling) else 1
        rows = [i for i in range(len(ids)) for _ in range(draws)]
        rng = np.random.default_rng(seed)
        results = [[] for _ in ids]
        lengths = [len(ids[i]) for i in rows]
        for chunk, _, _, limit in plan(lengths, self.max_target_length, max_length):
            chunk_seed = int(np.int32(rng.integers(0, 2**31 - 1)))
            for r, j in enumerate(chunk):
                source = ids[rows[j]]
                if isinstance(sampler, samplers.Beam):
                    found = self.beam(source, sampler.width, sampler.length_penalty, limit)[:n]
                elif isinstance(sampler, samplers.Greedy):
                    found = [self.greedy(source, limit)]
                else:
                    found = [self.sample(source, limit, chunk_seed, r, sampler)]
                results[rows[j]] += [(cut(out), score) for out, score in found]
        return results
