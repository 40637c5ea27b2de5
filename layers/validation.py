"""Argument checks shared by the layers.

Every message names the argument and the value received, so a user sees what
to fix without reading a TensorFlow traceback.
"""

import numbers


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


def check_rate(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:
        raise ValueError(f"`{name}` must be a float in [0, 1). Received: {name}={value!r}")
    return float(value)


def check_rank(name, shape, rank):
    if shape is None or len(shape) != rank:
        raise ValueError(
            f"`{name}` must have rank {rank}, i.e. shape "
            f"{'(batch, sequence, features)' if rank == 3 else f'of rank {rank}'}. "
            f"Received: {name}.shape={None if shape is None else tuple(shape)}"
        )
    return shape


def known_shape(x):
    """The static shape of `x` as a tuple (None for unknown dims), or None if
    the rank itself is unknown."""
    if x is None:
        return None
    shape = getattr(x, "shape", None)
    if shape is None:
        import numpy as np

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
    if shape is None or x is None:
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
