"""Self-contained export folders: what an app needs beside the model.

Every export (`python -m export savedmodel`, `python -m export tflite`,
`python -m export.kinds.seq2seq`) writes, beside its model files:

- `preprocessing.json`: the exact text -> ids rules (normalisation, vocabularies,
  unknown / pad / BOS / EOS ids, lengths) or, for a generator, the input rules,
  with test vectors (input -> ids) computed by this project's own preprocessing,
  so an app can check its re-implementation. It names the files it reads
  (vocabularies inside an existing sidecar are referenced, not copied).
- `labels.txt`: the tag names or class names, one per line (id = line number),
  for kinds that have them.
- `model_card.json` and `MODEL_CARD.md`: data, the run's test-split metrics
  (copied from its metrics.json), quantization, intended use, licence.
- the tokenizer model (`spm.model`) for seq2seq, where the export did not
  already ship it.

A folder of its own (a SavedModel version directory, the seq2seq steps folder)
gets these names; a `.tflite` file written into a shared directory gets them
prefixed with its stem (`tagger.tflite` -> `tagger.preprocessing.json`, ...), so
several exports can share a directory. The caller writes the files (atomically,
with the rest of its export); this module only computes them.
"""

import json
import os

PREPROCESSING = "preprocessing.json"
LABELS = "labels.txt"
CARD_JSON = "model_card.json"
CARD_MD = "MODEL_CARD.md"
FORMAT = "attention-zoo-preprocessing/1"
LICENSE = "Apache-2.0"

# Every character Python's str.split() (no argument) splits on: the tagger's
# sentence -> tokens rule, listed so that an app needs no Python to follow it.
WHITESPACE = [c for c in range(0x110000) if chr(c).isspace()]


def _jsonable(value):
    return json.loads(
        json.dumps(value, default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v))
    )


def files(source, kind, fmt, model_files, prefix="", quantize="none", parity=None, refs=None):
    """{file name: bytes} of the bundle (names already prefixed).

    Args:
        source: the export's `rundir.Source`.
        kind: its `ExportKind`.
        fmt: "savedmodel" or "tflite".
        model_files: the files the export itself writes (named in the card).
        prefix: "" or "STEM." (see the module docstring).
        quantize: the TFLite quantization mode ("none" for a SavedModel).
        parity: the export's LiteRT-vs-Keras report, if any.
        refs: {what: file name} of files the export already writes and the spec
            points to: "vocab" (a JSON file holding the vocabularies, e.g. the
            .tflite sidecar), "tokenizer" (spm.model). Missing ones are written here.
    """
    refs = dict(refs or {})
    out = {}
    extra = kind.bundle_extra_files(source)
    for what, (name, content) in extra.items():
        if what not in refs:
            refs[what] = prefix + name
            out[prefix + name] = content
    labels = kind.labels(source)
    if labels is not None:
        refs["labels"] = prefix + LABELS
        out[prefix + LABELS] = "".join(f"{label}\n" for label in labels).encode()
    spec = dict(format=FORMAT, kind=kind.name, **kind.preprocessing(source, refs))
    out[prefix + PREPROCESSING] = _json_bytes(spec)
    card = model_card(source, kind, fmt, list(model_files) + sorted(out), quantize, parity)
    out[prefix + CARD_JSON] = _json_bytes(card)
    out[prefix + CARD_MD] = render_card(card).encode()
    return out


def _json_bytes(obj):
    return (json.dumps(_jsonable(obj), indent=2, ensure_ascii=False) + "\n").encode()


def model_card(source, kind, fmt, file_names, quantize, parity):
    model = kind.model(source)
    config = source.config
    metrics = source.metrics()
    keys = kind.card_keys or [k for k in metrics if k.startswith("test_")]
    # Numbers only, by type: a JSON true is an int to isinstance.
    metrics = {k: metrics[k] for k in keys if type(metrics.get(k)) in (int, float)}
    card = {
        "model": {
            "kind": kind.name,
            "name": getattr(model, "name", None),
            "arch": config.get("model", {}).get("arch") or getattr(model, "arch", None),
            "parameters": int(model.count_params()),
        },
        "format": fmt,
        "files": sorted(set(file_names)),
        "source_run": os.path.abspath(source.run_dir) if source.run_dir else None,
        "data": config.get("data"),
        "metrics": metrics,
        "metrics_note": (
            "copied from the run's metrics.json (test split)"
            if source.run_dir
            else "no run directory: a bare model has no recorded metrics"
        ),
        "quantization": {
            "mode": quantize,
            "weights": {
                "none": "float32",
                "fp16": "float16",
                "dynamic": "int8 weights, float activations",
                "int8": "int8 weights and activations",
                "int16x8": "int8 weights, int16 activations",
            }[quantize],
        },
        "intended_use": kind.intended_use,
        "limitations": kind.limitations,
        "licence": {
            "model_and_code": f"{LICENSE} (the attention-zoo project's licence, LICENSE)",
            "data": "the training data's own licence: see data",
        },
    }
    if parity:
        card["quantization"]["parity_vs_keras"] = parity
    return card


def render_card(card):
    """MODEL_CARD.md from model_card.json (the same facts, for people)."""
    m = card["model"]
    lines = [
        f"# Model card: {m['kind']} ({m.get('arch') or m.get('name')})",
        "",
        f"Format: {card['format']}; {m['parameters']:,} parameters.",
        f"Files: {', '.join(f'`{f}`' for f in card['files'])}.",
        "",
        "## Data",
        "",
        f"```\n{json.dumps(card['data'], indent=2, ensure_ascii=False)}\n```",
        "",
        "## Metrics",
        "",
        card["metrics_note"] + ".",
        "",
    ]
    if card["metrics"]:
        lines += ["| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in card["metrics"].items()]
        lines.append("")
    q = card["quantization"]
    lines += ["## Quantization", "", f"`{q['mode']}`: {q['weights']}."]
    if "parity_vs_keras" in q:
        lines.append(f"Checked against Keras before writing: {json.dumps(q['parity_vs_keras'])}.")
    lines += [
        "",
        "## Intended use",
        "",
        card["intended_use"],
        "",
        "## Limitations",
        "",
        card["limitations"],
        "",
        "## Licence",
        "",
        f"Model and code: {card['licence']['model_and_code']}. Data: {card['licence']['data']}.",
        "",
    ]
    return "\n".join(lines)
