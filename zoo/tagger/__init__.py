"""The part-of-speech tagger: `model` (the `Tagger`, registered as "tagger"), `archs`
(attention / fc / window / bilstm cores), `layers`, `encoding`."""
