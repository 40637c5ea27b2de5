"""The seq2seq position options for length generalisation (`random_positions`,
`source_positions="both_ends"`): the encodings against the paper's formula in NumPy,
the training draw's properties, cached decoding against a full recompute, the config."""

import keras
import numpy as np
import pytest

import zoo
from tests.layers.test_sinusoidal_position_encoding import paper_formula_at as pe
from tests.zoo.test_decoding import reference_greedy, train_on_reversal
from zoo.seq2seq import decoding
from zoo.seq2seq.tokenization import BOS_ID

VOCAB = 20


def build(kind="universal_transformer", **kwargs):
    keras.utils.set_random_seed(0)
    options = dict(num_steps=2) if kind == "universal_transformer" else dict(num_layers=1)
    options.update(hidden_dim=16, num_heads=2, intermediate_dim=32, dropout=0.0)
    options.update(max_source_length=16, max_target_length=12)
    options.update(kwargs)
    return zoo.build(kind, vocabulary_size=VOCAB, **options)


SOURCE = np.array([[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]], "int32")


def test_both_ends_source_counts_from_start_and_end_target_from_start():
    model = build(source_positions="both_ends")
    x = np.zeros((2, 5, 16), "float32")
    got = np.asarray(model._source_encoding(x, SOURCE != 0))
    for row, n in enumerate((5, 3)):
        want = np.concatenate([pe(np.arange(n), 8), pe(np.arange(n)[::-1], 8)], -1)
        np.testing.assert_allclose(got[row, :n], want, atol=1e-5)
    target = np.asarray(model._target_encoding(np.zeros((2, 4, 16), "float32"), start_index=3))
    want = np.concatenate([pe(np.arange(3, 7), 8), pe(np.arange(3, 7), 8)], -1)
    np.testing.assert_allclose(target[1], want, atol=1e-5)


def test_given_positions_reach_both_ends():
    model = build(source_positions="both_ends")
    positions = np.array([[0, 4, 9, 30, 31, 50], [0, 2, 3, 11, 40, 41]], "float32")
    got = np.asarray(
        model._source_encoding(np.zeros((2, 5, 16), "float32"), SOURCE != 0, positions)
    )
    # Row 1 has 3 tokens: from the end they are positions[2], positions[1], positions[0].
    want = np.concatenate([pe(positions[1, :3], 8), pe(positions[1, :3][::-1], 8)], -1)
    np.testing.assert_allclose(got[1, :3], want, atol=1e-4)


def test_training_draws_sorted_positions_from_zero_dense_to_spread():
    # M: the longest string the model takes (40), rounded up to a multiple of 8.
    model = build(random_positions=True, max_source_length=37, max_target_length=12)
    draws = np.stack([np.asarray(model._sample_positions(64, 12)) for _ in range(3)])
    assert draws.shape == (3, 64, 12)
    assert (draws[..., 0] == 0).all() and (draws < 40).all()
    assert (np.diff(draws, axis=-1) > 0).all()
    rows = draws.reshape(-1, 12)
    assert len({tuple(r) for r in rows}) > 150  # not one fixed subset
    # Spread over the whole range, and dense runs near the start and far from it.
    assert rows[:, -1].max() >= 38 and rows[:, -1].min() <= 16
    width = rows[:, -1] - rows[:, 1]
    dense = width <= 13
    assert dense.mean() > 0.05 and (rows[dense, 1] > 15).any() and (rows[dense, 1] <= 3).any()
    assert (width >= 30).mean() > 0.1


def test_random_positions_only_change_training_calls():
    model = build(random_positions=True, source_positions="both_ends")
    inputs = {"source_ids": SOURCE, "target_ids": np.array([[BOS_ID, 5, 6], [BOS_ID, 7, 8]])}
    plain = np.asarray(model(inputs))
    np.testing.assert_array_equal(plain, np.asarray(model(inputs, training=False)))
    assert np.abs(np.asarray(model(inputs, training=True)) - plain).max() > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, options",
    [
        ("universal_transformer", dict(random_positions=True, source_positions="both_ends")),
        ("universal_transformer", dict(act=True, source_positions="both_ends")),
        ("seq2seq", dict(random_positions=True, source_positions="both_ends")),
    ],
)
def test_cached_greedy_equals_full_recompute(kind, options):
    model = build(kind, **options)
    # Briefly trained, so the tokens vary (an untrained model repeats one).
    source = train_on_reversal(model, 256, epochs=2, warmup=10, vocab=VOCAB)[:4]
    np.testing.assert_array_equal(
        np.asarray(decoding.greedy(model, source, 10)), reference_greedy(model, source, 10)
    )


def test_position_options_are_off_by_default():
    for model in (build(), build("seq2seq"), build(position="learned")):
        assert (model.random_positions, model.source_positions) == (False, "start")


def test_config_round_trip_and_bad_values(tmp_path):
    model = build(random_positions=True, source_positions="both_ends")
    config = model.get_config()
    assert (config["random_positions"], config["source_positions"]) == (True, "both_ends")
    again = model.__class__.from_config(config)
    assert (again.random_positions, again.source_positions) == (True, "both_ends")
    with pytest.raises(ValueError, match="random_positions=64"):
        build(random_positions=64)
    with pytest.raises(ValueError, match="source_positions='middle'"):
        build(source_positions="middle")
    with pytest.raises(ValueError, match="position='learned'"):
        build("seq2seq", position="learned", source_positions="both_ends")


@pytest.mark.slow
def test_saved_model_keeps_options_and_numbers(tmp_path):
    model = build(random_positions=True, source_positions="both_ends")
    inputs = {"source_ids": SOURCE, "target_ids": np.array([[BOS_ID, 5], [BOS_ID, 7]])}
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert (loaded.random_positions, loaded.source_positions) == (True, "both_ends")
    np.testing.assert_allclose(np.asarray(loaded(inputs)), np.asarray(model(inputs)), atol=1e-5)
