"""The part-of-speech tagger: `model` (the `Tagger` and its builder, registered as
"tagger"), `archs` (attention / fc / window / bilstm cores), `layers`, `encoding`."""
