"""How a translator picks output tokens: `translator.generate(texts, sampler=...)`.

A sampler is a name or one of these objects (KerasHub's `generate(sampler=...)`
convention):

- `Greedy()` ("greedy"): the most likely token at each step.
- `Beam(width=4, length_penalty=0.6)` ("beam"): beam search, ranking finished
  hypotheses by `log p / ((5 + length) / 6) ** length_penalty` (GNMT).
- `Sampling(temperature=1.0, top_k=None, top_p=None)`: ancestral sampling from
  the softmax of `logits / temperature`, restricted to the `top_k` most likely
  tokens and/or the smallest set whose probability reaches `top_p` (nucleus).
  `TopK(k)` ("top_k", k=10) and `TopP(p)` ("top_p", p=0.9) are shorthands;
  "random" is plain sampling.

Example:

>>> from zoo.seq2seq import samplers
>>> samplers.get("top_k")
TopK(k=10, temperature=1.0)
>>> samplers.get(samplers.Beam(width=2)).width
2
"""

import dataclasses
import numbers


def positive_int(name, value):
    """`value` as an int; ValueError naming `name` unless it is a positive int."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"`{name}` must be a positive int. Received: {name}={value!r}")
    return int(value)


def check_number(name, value, low, high=None, low_open=True):
    """`value` as a float; ValueError naming `name` unless it is a number above `low`
    (or at it, without `low_open`) and at most `high`."""
    bad = isinstance(value, bool) or not isinstance(value, numbers.Real)
    if not bad:
        bad = value <= low if low_open else value < low
        bad = bad or (high is not None and value > high)
    if bad:
        bounds = f"{'>' if low_open else '>='} {low}" + (
            f" and <= {high}" if high is not None else ""
        )
        raise ValueError(f"`{name}` must be a number {bounds}. Received: {name}={value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class Greedy:
    """The most likely token at each step."""


@dataclasses.dataclass(frozen=True)
class Beam:
    """Beam search with `width` hypotheses and the GNMT length penalty."""

    width: int = 4
    length_penalty: float = 0.6

    def __post_init__(self):
        positive_int("width", self.width)
        check_number("length_penalty", self.length_penalty, 0.0, low_open=False)


@dataclasses.dataclass(frozen=True)
class Sampling:
    """Ancestral sampling with temperature and optional top-k / top-p filtering."""

    temperature: float = 1.0
    top_k: int = None
    top_p: float = None

    def __post_init__(self):
        check_number("temperature", self.temperature, 0.0)
        if self.top_k is not None:
            positive_int("top_k", self.top_k)
        if self.top_p is not None:
            check_number("top_p", self.top_p, 0.0, 1.0)


def TopK(k=10, temperature=1.0):  # noqa: N802  (reads as a class, like KerasHub's TopKSampler)
    """Sampling from the `k` most likely tokens."""
    positive_int("k", k)
    return _Named(
        "TopK", f"k={k}, temperature={float(temperature)}", temperature=temperature, top_k=k
    )


def TopP(p=0.9, temperature=1.0):  # noqa: N802
    """Nucleus sampling: from the smallest set of tokens whose probability reaches `p`."""
    check_number("p", p, 0.0, 1.0)
    return _Named(
        "TopP", f"p={p}, temperature={float(temperature)}", temperature=temperature, top_p=p
    )


class _Named(Sampling):
    """A `Sampling` that prints as the shorthand that made it."""

    def __init__(self, name, args, **kwargs):
        super().__init__(**kwargs)
        object.__setattr__(self, "_repr", f"{name}({args})")

    def __repr__(self):
        return self._repr


def check_request(sampler, num_return_sequences):
    """`num_return_sequences` as an int, checked with `sampler` (an object of
    this module) as both decoders (`zoo.seq2seq.decoding.generate_ids`,
    `zoo.litert.StepModel.generate_ids`) take them."""
    n = positive_int("num_return_sequences", num_return_sequences)
    if isinstance(sampler, Greedy) and n != 1:
        raise ValueError(
            "greedy decoding returns one sequence per input; use a beam or "
            f"sampling sampler. Received: num_return_sequences={n}"
        )
    if isinstance(sampler, Beam) and n > sampler.width:
        raise ValueError(
            f"`num_return_sequences` must be at most the beam width ({sampler.width}). "
            f"Received: num_return_sequences={n}"
        )
    if not isinstance(sampler, (Greedy, Beam, Sampling)):
        raise ValueError(
            "`sampler` must be a zoo.seq2seq.samplers object or name. "
            f"Received: sampler={sampler!r}"
        )
    return n


_NAMES = {"greedy": Greedy, "beam": Beam, "top_k": TopK, "top_p": TopP, "random": Sampling}


def get(sampler):
    """A sampler object from a name ("greedy", "beam", "top_k", "top_p", "random")
    or a sampler object (returned as is)."""
    if isinstance(sampler, (Greedy, Beam, Sampling)):
        return sampler
    if isinstance(sampler, str) and sampler in _NAMES:
        return _NAMES[sampler]()
    raise ValueError(
        f"`sampler` must be one of {sorted(_NAMES)} or a zoo.seq2seq.samplers object. "
        f"Received: sampler={sampler!r}"
    )
