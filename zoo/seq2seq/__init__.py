"""Sequence-to-sequence models: `transformer` (registered as "seq2seq"),
`universal_transformer`, with their `tokenization`, `decoding`, `samplers` and
training `objectives`."""
