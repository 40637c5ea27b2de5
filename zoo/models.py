"""Every zoo model, imported: `import zoo.models` registers all the classes a zoo
model file names (layers and models), so `keras.models.load_model` needs no
`custom_objects`. `BUILDERS` maps each `zoo.build` name to its builder."""

import functools

import layers  # noqa: F401  (registers the layers that saved models refer to)
from zoo.sagan.model import build_discriminator, build_generator
from zoo.seq2seq.transformer import Seq2SeqTransformer, build_model
from zoo.seq2seq.universal_transformer import UniversalTransformer
from zoo.tagger.model import Tagger

BUILDERS = {
    "tagger": Tagger,
    "seq2seq": functools.partial(build_model, Seq2SeqTransformer),
    "universal_transformer": functools.partial(build_model, UniversalTransformer),
    "sagan_generator": build_generator,
    "sagan_discriminator": build_discriminator,
}
