"""Argument checks shared by the layers: every layer validates its arguments here.

Every message names the argument and the value received, so a user sees what
to fix without reading a TensorFlow traceback.
"""

import math
import numbers

import keras
import numpy as np
from keras import ops


def check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {list(choices)}. Received: {name}={value!r}")
    return value


def check_int(name, value, *, minimum=1, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"`{name}` must be an integer >= {minimum}. Received: {name}={value!r}")
    if value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}. Received: {name}={value!r}")
    return int(value)


def check_pair(name, value):
    """An int >= 1 or a pair of them (a kernel size, strides), as a pair."""
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise ValueError(
                f"`{name}` must be an int or a pair of ints. Received: {name}={value!r}"
            )
        return tuple(check_int(name, v) for v in value)
    v = check_int(name, value)
    return (v, v)


def check_activation(name, value):
    """A Keras activation name or callable, returned as the function."""
    try:
        return keras.activations.get(value)
    except ValueError:
        raise ValueError(
            f"`{name}` must be a Keras activation name or callable. Received: {name}={value!r}"
        ) from None


def check_axis(name, value):
    """An int, or a non-empty list or tuple of ints (returned as a list)."""
    many = isinstance(value, (list, tuple))
    axes = list(value) if many else [value]
    if not axes or not all(isinstance(a, int) and not isinstance(a, bool) for a in axes):
        raise ValueError(
            f"`{name}` must be an int or a non-empty list of ints. Received: {name}={value!r}"
        )
    return axes if many else value


def check_even(name, value, *, when):
    """An even int (`when` says which other argument asks for it)."""
    if value % 2:
        raise ValueError(f"`{name}` must be even when {when}. Received: {name}={value}")
    return value


def check_positive_number(name, value):
    """A finite int or float > 0 (not a bool), returned unchanged."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"`{name}` must be a positive number. Received: {name}={value!r}")
    return value


def check_rate(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:
        raise ValueError(f"`{name}` must be a float in [0, 1). Received: {name}={value!r}")
    return float(value)


def check_bool(name, value):
    """A Python or NumPy bool, returned as a Python bool (not a truthy string,
    a 1 or a tensor: a call argument that decides the graph's structure)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"`{name}` must be True or False. Received: {name}={value!r}")
    return bool(value)


def check_chunk_size(chunk_size):
    """`None`, `"auto"` or an int >= 1; anything else is a ValueError."""
    if chunk_size is None or (isinstance(chunk_size, str) and chunk_size == "auto"):
        return chunk_size
    if (
        isinstance(chunk_size, bool)
        or not isinstance(chunk_size, numbers.Integral)
        or chunk_size < 1
    ):
        raise ValueError(
            '`chunk_size` must be None, "auto" or an integer >= 1. '
            f"Received: chunk_size={chunk_size!r}"
        )
    return int(chunk_size)


def check_keras_attention_names(
    output_dim, window, output_shape, attention_axes, sliding_window, flash_attention, use_gate
):
    """Checks `keras.layers.MultiHeadAttention`'s constructor names that
    `layers.MultiHeadAttention` accepts and maps them onto its own; returns
    `(output_dim, window)`."""
    if output_shape is not None:
        shape = (output_shape,) if isinstance(output_shape, numbers.Integral) else output_shape
        if not isinstance(shape, (tuple, list)) or len(shape) != 1:
            raise ValueError(
                "`output_shape` must be an int or a 1-tuple (outputs of rank 3). "
                f"Received: output_shape={output_shape!r}"
            )
        if output_dim is not None and output_dim != shape[0]:
            raise ValueError(
                "Pass `output_dim` or `output_shape`, not both. "
                f"Received: output_dim={output_dim}, output_shape={output_shape!r}"
            )
        output_dim = shape[0]
    axes = (attention_axes,) if isinstance(attention_axes, numbers.Integral) else attention_axes
    if axes is not None and tuple(axes) not in ((1,), (-2,)):
        raise ValueError(
            "`attention_axes` may only name the sequence axis of [batch, length, "
            "features] inputs (1 or -2); for 2-D feature maps see SelfAttention2D. "
            f"Received: attention_axes={attention_axes!r}"
        )
    if sliding_window is not None:
        sliding_window = check_int("sliding_window", sliding_window)
        if window is not None and window != sliding_window - 1:
            raise ValueError(
                "Pass `window` or `sliding_window` (= window + 1), not both. "
                f"Received: window={window}, sliding_window={sliding_window}"
            )
        window = sliding_window - 1
    if flash_attention not in (None, False):
        raise ValueError(
            "`flash_attention` must be None or False: this layer has its own "
            "fused paths, and `chunk_size` for long sequences. "
            f"Received: flash_attention={flash_attention!r}"
        )
    if use_gate not in (None, False):
        raise ValueError(
            f"`use_gate` must be False (not supported). Received: use_gate={use_gate!r}"
        )
    return output_dim, window


def check_rank(name, shape, *, known_features=False):
    """A sequence's shape: rank 3, `(batch, sequence, features)`, its feature
    size known with `known_features` (what a layer's build needs)."""
    if shape is None or len(shape) != 3:
        raise ValueError(
            f"`{name}` must have rank 3, i.e. shape (batch, sequence, features). "
            f"Received: {name}.shape={None if shape is None else tuple(shape)}"
        )
    if known_features and shape[-1] is None:
        raise ValueError(
            f"The last dimension of `{name}` must be known. Received: {name}.shape={tuple(shape)}"
        )


def check_input_rank(input_shape, ranks, layer_name):
    """Raises unless `input_shape` has one of `ranks`; the message names the layer."""
    if len(input_shape) not in ranks:
        expected = " or ".join(str(r) for r in ranks)
        raise ValueError(
            f"{layer_name} expects `inputs` of rank {expected}. Received: "
            f"inputs.shape={tuple(input_shape)} (rank {len(input_shape)})"
        )


def static_int(value):
    """Returns `value` as a Python int when it is known now, else `None`.

    Python ints, NumPy integers and eager scalar tensors are known; symbolic
    tensors inside a traced function are not.
    """
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    try:
        array = ops.convert_to_numpy(value)
    except Exception:  # symbolic tensor: the value is a run-time quantity
        return None
    if np.ndim(array) != 0:
        return None
    return int(array)


def check_start_index(start_index, sequence_length, max_length, *, name):
    """Raises ValueError when `start_index + sequence_length > max_length`.

    Only checks what is known statically; see the position layers' docstrings
    for the behaviour with run-time lengths.
    """
    start = static_int(start_index)
    if start is not None and start < 0:
        raise ValueError(f"`start_index` must be >= 0. Received: start_index={start}")
    if max_length is None or sequence_length is None or start is None:
        return
    if start + sequence_length > max_length:
        raise ValueError(
            f"{name}: the input sequence (length {sequence_length} starting at "
            f"start_index={start}, i.e. {start + sequence_length} positions) "
            f"is longer than `sequence_length={max_length}`. Received: "
            f"length={start + sequence_length}"
        )


def known_shape(x):
    """The static shape of `x` as a tuple (None for unknown dims), or None if
    the rank itself is unknown."""
    if x is None:
        return None
    shape = getattr(x, "shape", None)
    if shape is None:
        shape = np.shape(x)
    try:
        return tuple(None if d is None else int(d) for d in shape)
    except (TypeError, ValueError):
        return None


def check_shape(name, x, expected, described):
    """Raises if the known dims of `x` contradict `expected`.

    `expected` holds, per axis, an int, None (anything) or a tuple of allowed
    ints; `described` names the axes for the message, e.g.
    "(batch, query_length)". Unknown dims (symbolic shapes) are not judged
    here: what cannot be known while tracing cannot be wrong yet.
    """
    shape = known_shape(x)
    if shape is None:  # no `x`, or its rank is unknown
        return
    wanted = tuple(None if e is None else (e if isinstance(e, tuple) else (e,)) for e in expected)
    ok = len(shape) == len(wanted) and all(
        w is None or s is None or None in w or s in w for s, w in zip(shape, wanted)
    )
    if not ok:
        values = ", ".join(
            "None" if w is None or None in w else "|".join(map(str, w)) for w in wanted
        )
        raise ValueError(
            f"`{name}` must have shape {described} = ({values}). Received: {name}.shape={shape}"
        )
