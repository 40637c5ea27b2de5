"""Greedy and beam-search decoding with the static-shape KV cache.

The encoder runs once; the decoder runs one step per token, reading and
writing fixed-size caches `[B, 2, max_length, heads, head_dim]` at the step's
position, inside `keras.ops.while_loop`. Every shape is static, so the whole
decode (encoder included) compiles with XLA (`jit_compile=True`) and converts
to TFLite's builtin WHILE.

Beam search keeps `width` live hypotheses per input, ranks finished ones by
`log p / ((5 + length) / 6) ** alpha` (Wu et al., 2016), finalises a
hypothesis only when EOS is among the `width` best continuations (as fairseq
does, so width 1 is exactly greedy), and stops an input early once its worst
finished hypothesis beats the best live one at the current length (the
Hugging Face heuristic).

Outputs are id arrays `[B, max_length]` without BOS: the tokens, then EOS,
then padding (0).
"""

import keras
import numpy as np
from keras import ops

from zoo.litert import plan
from zoo.seq2seq import samplers
from zoo.seq2seq.tokenization import BOS_ID, EOS_ID, PAD_ID, cut

_NEG = -1e9


def _argmax(logits):
    # tf.argmax, not keras.ops.argmax: the latter emits a Flex BitwiseAnd in TFLite.
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.argmax(logits, axis=-1, output_type=tf.int32)
    return ops.cast(ops.argmax(logits, axis=-1), "int32")


def _max_length(model, max_length):
    if max_length is None:
        return int(model.max_target_length)
    max_length = samplers.positive_int("max_length", max_length)
    if model.position == "learned" and max_length > model.max_target_length:
        raise ValueError(
            f"`max_length` exceeds the learned positions (max_target_length="
            f"{model.max_target_length}). Received: max_length={max_length}"
        )
    return max_length


def length_penalty(length, alpha):
    """GNMT length penalty `((5 + length) / 6) ** alpha`."""
    return ops.power((5.0 + ops.cast(length, "float32")) / 6.0, alpha)


def greedy(model, source_ids, max_length=None):
    """Greedy decoding. source ids int32 `[B, S]` -> ids `[B, max_length]`."""
    return _decode(model, source_ids, max_length, lambda logits, i: _argmax(logits))


def _decode(model, source_ids, max_length, pick):
    """One token per row and step, `pick(logits [B, V], step) -> ids [B]`, until every
    row has emitted EOS (then PAD) or `max_length` steps: the cached-decoder loop of
    greedy decoding and sampling."""
    max_length = _max_length(model, max_length)
    source_ids = ops.cast(source_ids, "int32")
    batch = ops.shape(source_ids)[0]
    encoder_output, source_mask = model.encode(source_ids)
    cross = model.cross_caches(encoder_output)
    caches = model.empty_caches(batch, max_length)
    tokens = ops.zeros((batch, max_length), "int32")
    current = ops.full((batch,), BOS_ID, "int32")
    done = ops.zeros((batch,), "bool")

    def cond(i, current, done, tokens, caches):
        return ops.logical_and(i < max_length, ops.logical_not(ops.all(done)))

    def body(i, current, done, tokens, caches):
        logits, caches = model.decode_step(current, i, caches, cross, source_mask)
        nxt = ops.where(done, PAD_ID, pick(logits, i))
        tokens = ops.slice_update(tokens, [ops.zeros((), "int32"), i], ops.reshape(nxt, (-1, 1)))
        done = ops.logical_or(done, ops.equal(nxt, EOS_ID))
        return i + 1, nxt, done, tokens, caches

    loop = ops.while_loop(cond, body, (ops.zeros((), "int32"), current, done, tokens, caches))
    return loop[3]


def _gather_beams(x, index, batch, width, grouped=False):
    """Picks beams. `index` `[B, n]` holds beam numbers in 0..width-1; `x` is
    `[B * width, ...]` (-> `[B * n, ...]`) or, with `grouped`, `[B, width, L]`
    (-> `[B, n, L]`)."""
    flat = ops.reshape(ops.arange(batch, dtype="int32"), (-1, 1)) * width + index
    flat = ops.reshape(flat, (-1,))
    if grouped:
        rows = ops.take(ops.reshape(x, (-1, x.shape[2])), flat, axis=0)
        return ops.reshape(rows, (batch, -1, x.shape[2]))
    return ops.take(x, flat, axis=0)


def beam_candidates(model, source_ids, width=4, alpha=0.6, max_length=None):
    """Beam search's final hypotheses: (finished ids `[B, width, L]`, their
    normalised scores `[B, width]` (best first; `-1e9` marks an empty slot),
    live ids `[B, width, L]`, their scores normalised at length L)."""
    width = samplers.positive_int("width", width)
    alpha = samplers.check_number("alpha", alpha, 0.0, low_open=False)
    if 2 * width > model.vocabulary_size:
        raise ValueError(
            f"`width` must be at most half the vocabulary ({model.vocabulary_size}). "
            f"Received: width={width}"
        )
    max_length = _max_length(model, max_length)
    k, vocab = int(width), int(model.vocabulary_size)
    source_ids = ops.cast(source_ids, "int32")
    batch = ops.shape(source_ids)[0]
    encoder_output, source_mask = model.encode(source_ids)
    encoder_output = ops.repeat(encoder_output, k, axis=0)
    source_mask = ops.repeat(source_mask, k, axis=0)
    cross = model.cross_caches(encoder_output)
    caches = model.empty_caches(batch * k, max_length)
    positions = ops.reshape(ops.arange(max_length, dtype="int32"), (1, 1, -1))

    first = ops.concatenate([ops.zeros((1,), "float32"), ops.full((k - 1,), _NEG, "float32")])
    alive_logp = ops.tile(ops.reshape(first, (1, k)), (batch, 1))
    alive_seq = ops.zeros((batch, k, max_length), "int32")
    finished_seq = ops.zeros((batch, k, max_length), "int32")
    finished_score = ops.full((batch, k), _NEG, "float32")
    current = ops.full((batch * k,), BOS_ID, "int32")
    done = ops.zeros((batch,), "bool")
    rank = ops.reshape(ops.arange(2 * k, dtype="int32"), (1, -1))

    def cond(i, *state):
        return ops.logical_and(i < max_length, ops.logical_not(ops.all(state[-1])))

    def body(i, current, caches, alive_logp, alive_seq, finished_seq, finished_score, done):
        logits, caches = model.decode_step(current, i, caches, cross, source_mask)
        logp = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
        scores = ops.reshape(alive_logp, (batch, k, 1)) + ops.reshape(logp, (batch, k, vocab))
        top_logp, top_index = ops.top_k(ops.reshape(scores, (batch, k * vocab)), 2 * k)
        top_index = ops.cast(top_index, "int32")
        from_beam = top_index // vocab
        token = top_index % vocab
        candidates = _gather_beams(alive_seq, from_beam, batch, k, grouped=True)
        candidates = ops.where(ops.equal(positions, i), ops.expand_dims(token, -1), candidates)
        is_eos = ops.equal(token, EOS_ID)

        live_logp, order = ops.top_k(ops.where(is_eos, _NEG, top_logp), k)
        order = ops.cast(order, "int32")
        new_alive_seq = _gather_beams(candidates, order, batch, 2 * k, grouped=True)
        new_from = ops.take_along_axis(from_beam, order, axis=1)
        caches = tuple(_gather_beams(c, new_from, batch, k) for c in caches)
        current = ops.reshape(ops.take_along_axis(token, order, axis=1), (-1,))

        penalty = length_penalty(i + 1, alpha)
        # Inputs already done keep their finished set unchanged.
        final = ops.logical_and(is_eos, rank < k)
        final = ops.logical_and(final, ops.logical_not(ops.reshape(done, (-1, 1))))
        eos_score = ops.where(final, top_logp / penalty, _NEG)
        all_score = ops.concatenate([finished_score, eos_score], axis=1)
        all_seq = ops.concatenate([finished_seq, candidates], axis=1)
        new_score, order2 = ops.top_k(all_score, k)
        new_finished = _gather_beams(all_seq, ops.cast(order2, "int32"), batch, 3 * k, grouped=True)
        best_live = live_logp[:, 0] / penalty
        done = ops.logical_or(done, new_score[:, k - 1] >= best_live)
        return (i + 1, current, caches, live_logp, new_alive_seq, new_finished, new_score, done)

    state = (
        ops.zeros((), "int32"),
        current,
        caches,
        alive_logp,
        alive_seq,
        finished_seq,
        finished_score,
        done,
    )
    out = ops.while_loop(cond, body, state)
    _, _, _, alive_logp, alive_seq, finished_seq, finished_score, _ = out
    return finished_seq, finished_score, alive_seq, alive_logp / length_penalty(max_length, alpha)


def filter_logits(logits, temperature=1.0, top_k=None, top_p=None):
    """Logits `[B, V]` divided by `temperature`; then every token outside the
    `top_k` most likely set to -1e9; then, of the survivors (renormalised),
    every token outside the smallest set whose probability reaches `top_p`
    (nucleus). The order of Hugging Face's logits warpers; the most likely
    token always stays."""
    samplers.Sampling(temperature, top_k, top_p)  # checks the arguments
    logits = ops.cast(logits, "float32") / float(temperature)
    vocab = int(logits.shape[-1])
    if top_k is not None and top_k < vocab:
        kth = ops.top_k(logits, int(top_k))[0][:, -1:]
        logits = ops.where(logits < kth, _NEG, logits)
    if top_p is not None and top_p < 1:
        ranked = ops.top_k(logits, vocab)[0]
        probs = ops.softmax(ranked, axis=-1)
        before = ops.cumsum(probs, axis=-1) - probs  # mass of the tokens ranked above
        kept = ops.where(before < float(top_p), ranked, ops.full_like(ranked, np.inf))
        threshold = ops.min(kept, axis=-1, keepdims=True)
        logits = ops.where(logits < threshold, _NEG, logits)
    return logits


def _uniform(shape, seed, step):
    """Uniform (0, 1) float32 `[B, V]` from a counter hash of (seed, step, row,
    column): integer ops only (two murmur3 finalisers), so the bits are the same
    eagerly, under XLA and on any device, which TensorFlow's stateless Philox
    ops are not (XLA's stream differs from the CPU kernel's)."""

    def counter(n, axis):
        index = ops.cast(ops.arange(n, dtype="int32"), "uint32")
        return ops.reshape(index, (-1, 1) if axis == 0 else (1, -1))

    x = (
        ops.cast(seed, "uint32") * np.uint32(0x9E3779B1)
        + ops.cast(step, "uint32") * np.uint32(0x85EBCA77)
        + counter(shape[0], 0) * np.uint32(0xC2B2AE3D)
        + counter(shape[1], 1) * np.uint32(0x27D4EB2F)
    )
    for _ in range(2):
        x = x ^ ops.right_shift(x, np.uint32(16))
        x = x * np.uint32(0x85EBCA6B)
        x = x ^ ops.right_shift(x, np.uint32(13))
        x = x * np.uint32(0xC2B2AE35)
        x = x ^ ops.right_shift(x, np.uint32(16))
    return (ops.cast(ops.right_shift(x, np.uint32(8)), "float32") + 0.5) * (1.0 / 2**24)


def sample(model, source_ids, seed, temperature=1.0, top_k=None, top_p=None, max_length=None):
    """Ancestral sampling with the cached decoder. source ids int32 `[B, S]` ->
    ids `[B, max_length]`. `seed` (int32 scalar tensor or int) fixes the draws:
    step i takes Gumbel noise (Gumbel-max on the filtered logits, PAD and BOS
    excluded) from
    `_uniform`'s hash of `(seed, i, row, token)`, so equal seeds give equal
    outputs under XLA and without it, and with `zoo.load`'s TFLite step model.
    `filter_logits` checks the sampling arguments."""
    seed = ops.cast(seed, "int32")

    def pick(logits, i):
        # PAD and BOS are never outputs: a drawn PAD mid-row would end the row unscored.
        special = ops.logical_or(
            ops.equal(ops.arange(logits.shape[-1]), PAD_ID),
            ops.equal(ops.arange(logits.shape[-1]), BOS_ID),
        )
        logits = ops.where(special[None, :], _NEG, ops.cast(logits, "float32"))
        logits = filter_logits(logits, temperature, top_k, top_p)
        return _argmax(logits - ops.log(-ops.log(_uniform(ops.shape(logits), seed, i))))

    return _decode(model, source_ids, max_length, pick)


def sequence_log_probability(model, source_ids, output_ids):
    """Log-probability under `model` (teacher-forced) of each output row:
    `[B, L]` ids (the tokens, EOS, then padding) -> `[B]` float32, the sum over
    the tokens up to and including EOS."""
    source_ids = ops.cast(source_ids, "int32")
    output_ids = ops.cast(output_ids, "int32")
    batch = ops.shape(output_ids)[0]
    inputs = ops.concatenate([ops.full((batch, 1), BOS_ID, "int32"), output_ids[:, :-1]], axis=1)
    logits = model({"source_ids": source_ids, "target_ids": inputs}, training=False)
    logp = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
    picked = ops.squeeze(ops.take_along_axis(logp, ops.expand_dims(output_ids, -1), axis=-1), -1)
    return ops.sum(ops.where(ops.not_equal(output_ids, PAD_ID), picked, 0.0), axis=-1)


def compiled(
    model, kind="greedy", width=4, alpha=0.6, max_length=None, jit_compile=True, sampling=None
):
    """A cached `tf.function` (XLA by default; `jax.jit` under the JAX backend) of one
    decoder for `model`: "greedy" (ids), "beam_candidates" (`beam_candidates`'s four
    tensors), "sample" (called with the source ids and an int32 seed; `sampling`, a
    `zoo.seq2seq.samplers.Sampling`, gives its temperature, top-k and top-p)."""
    max_length = _max_length(model, max_length)
    sampling = sampling or samplers.Sampling()
    temperature, top_k, top_p = sampling.temperature, sampling.top_k, sampling.top_p
    key = (kind, width, float(alpha), max_length, jit_compile, float(temperature), top_k, top_p)
    cache = model.__dict__.setdefault("_compiled_decoders", {})
    if key not in cache:
        if kind == "greedy":
            fn = lambda src: greedy(model, src, max_length)  # noqa: E731
        elif kind == "beam_candidates":
            fn = lambda src: beam_candidates(model, src, width, alpha, max_length)  # noqa: E731
        elif kind == "sample":
            fn = lambda src, seed: sample(  # noqa: E731
                model, src, seed, temperature, top_k, top_p, max_length
            )
        else:
            raise ValueError(
                f"`kind` must be 'greedy', 'beam_candidates' or 'sample'. Received: kind={kind!r}"
            )
        if keras.backend.backend() == "jax":
            import jax

            cache[key] = jax.jit(fn) if jit_compile else fn
        else:
            import tensorflow as tf

            # The loops are ops.while_loop already: no AutoGraph (it cannot read a lambda's
            # source and says so on stderr).
            cache[key] = tf.function(
                fn, jit_compile=jit_compile, reduce_retracing=False, autograph=False
            )
    return cache[key]


def _each_batch(model, ids, batch_size, max_length, decode):
    """`decode(source array, decode length)`, one result per row, over the batches
    of `zoo.litert.plan` (similar lengths, a fixed row count, sources padded to
    multiples of 8, so a handful of XLA programs serve every input): the results
    in input order."""
    results = [None] * len(ids)
    lengths = [len(row) for row in ids]
    for chunk, width, rows, limit in plan(lengths, model.max_target_length, max_length, batch_size):
        array = np.zeros((rows, width), "int32")
        for r, i in enumerate(chunk):
            array[r, : len(ids[i])] = ids[i]
        for i, result in zip(chunk, decode(array, limit)):
            results[i] = result
    return results


def decode_ids(model, ids, beam_width=1, alpha=0.6, max_length=None, batch_size=64):
    """list of id lists -> list of output id lists (cut at EOS, no BOS/EOS),
    greedy or the best of a beam search: `generate_ids`'s first, without scores. In
    `zoo.litert.plan`'s batches: without `max_length`, caches and the attention over
    them scale with the inputs, not with the longest output the model allows, which
    matters most for beam search (it reorders every cache each step)."""
    sampler = samplers.Greedy()
    if beam_width != 1:
        sampler = samplers.Beam(
            beam_width, samplers.check_number("alpha", alpha, 0.0, low_open=False)
        )
    found = generate_ids(
        model, ids, sampler, max_length=max_length, batch_size=batch_size, with_scores=False
    )
    return [candidates[0][0] for candidates in found]


def generate_ids(
    model,
    ids,
    sampler,
    num_return_sequences=1,
    max_length=None,
    batch_size=64,
    seed=None,
    with_scores=True,
):
    """list of id lists -> for each input, `num_return_sequences` (ids, score)
    pairs, best first for beam search (ids cut at EOS, no BOS/EOS).

    `sampler` is a `zoo.seq2seq.samplers` object. Scores: beam search's length-normalised
    log-probability (`log p / ((5 + length) / 6) ** alpha`); for greedy decoding
    and sampling, the sequence's log-probability under the model (EOS included,
    temperature and top-k/top-p filtering not applied), or 0.0 without
    `with_scores` (a caller that drops them skips the teacher-forced pass)."""
    n = samplers.check_request(sampler, num_return_sequences)
    if isinstance(sampler, samplers.Beam):

        def beams(array, limit):
            fn = compiled(
                model,
                "beam_candidates",
                width=sampler.width,
                alpha=sampler.length_penalty,
                max_length=limit,
            )
            fin_seq, fin_score, live_seq, live_score = (np.asarray(t) for t in fn(array))
            for r in range(len(array)):
                # Finished hypotheses first, then live ones.
                found = [
                    (fin_seq[r, j], fin_score[r, j])
                    for j in range(sampler.width)
                    if fin_score[r, j] > _NEG / 2
                ]
                found += [(live_seq[r, j], live_score[r, j]) for j in range(sampler.width)]
                yield [(cut(s.tolist()), float(v)) for s, v in found[:n]]

        return _each_batch(model, ids, batch_size, max_length, beams)
    rng = np.random.default_rng(seed)

    def scored(array, limit):
        if isinstance(sampler, samplers.Greedy):
            out = compiled(model, "greedy", max_length=limit)(array)
        else:
            fn = compiled(model, "sample", max_length=limit, sampling=sampler)
            out = fn(array, np.int32(rng.integers(0, 2**31 - 1)))
        out = np.asarray(out)
        scores = np.zeros(len(out))
        if with_scores:
            scores = np.asarray(sequence_log_probability(model, array, out))
        return [(cut(row), float(score)) for row, score in zip(out.tolist(), scores)]

    # Sampling decodes each input n times (n = 1 for greedy), as n rows.
    rows = _each_batch(
        model, [row for row in ids for _ in range(n)], batch_size, max_length, scored
    )
    return [rows[i * n : (i + 1) * n] for i in range(len(ids))]
