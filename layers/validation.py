"""Argument checks shared by the layers.

Every message names the argument and the value received, so a user sees what
to fix without reading a TensorFlow traceback.
"""

import numbers


def check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(
            f"`{name}` must be one of {list(choices)}. Received: {name}={value!r}"
        )
    return value


def check_int(name, value, *, minimum=1, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(
            f"`{name}` must be an integer >= {minimum}. Received: {name}={value!r}"
        )
    if value < minimum:
        raise ValueError(
            f"`{name}` must be an integer >= {minimum}. Received: {name}={value!r}"
        )
    return int(value)


def check_rate(name, value):
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not 0.0 <= value < 1.0
    ):
        raise ValueError(
            f"`{name}` must be a float in [0, 1). Received: {name}={value!r}"
        )
    return float(value)


def check_rank(name, shape, rank):
    if shape is None or len(shape) != rank:
        raise ValueError(
            f"`{name}` must have rank {rank}, i.e. shape "
            f"{'(batch, sequence, features)' if rank == 3 else f'of rank {rank}'}. "
            f"Received: {name}.shape={None if shape is None else tuple(shape)}"
        )
    return shape
