"""CoNLL-U reader (UPOS column) built on the `conllu` package.

Rows whose ID is a range (``3-4``, multiword tokens) or a decimal (``8.1``, empty nodes)
are not words: they are skipped, so they never reach training or accuracy. Each line is
checked before `conllu` parses its sentence so that an error can name the file and line.
"""

import os
import re

import conllu

from train.config import check_data_file
from train.tagger.types import TaggedSentence
from zoo.cli import DataError

_WORD_ID = re.compile(r"^[1-9][0-9]*$")
_RANGE_ID = re.compile(r"^[1-9][0-9]*-[1-9][0-9]*$")
_EMPTY_ID = re.compile(r"^[0-9]+\.[1-9][0-9]*$")


def read_conllu(path):
    """Reads a CoNLL-U file into a list of `TaggedSentence` (FORM, UPOS).

    Raises `DataError` naming the file (and line) for a missing file, a malformed line,
    or a file without any word.
    """
    path = os.fspath(path)
    check_data_file(path)
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:  # unreadable: permissions, a device error
        raise DataError(f"cannot read {path}: {e.strerror or e}") from None
    sentences = []
    block, start = [], 0
    for number, line in enumerate(lines + [""], start=1):
        if line.strip():
            if not block:
                start = number
            block.append(line)
            continue
        if block:
            sentence = _parse_block(path, block, start)
            if sentence is not None:
                sentences.append(sentence)
            block = []
    if not sentences:
        raise DataError(f"empty data set: {path} contains no CoNLL-U word rows")
    return sentences


def _parse_block(path, block, start):
    for offset, line in enumerate(block):
        if line.startswith("#"):
            continue
        _check_row(path, start + offset, line)
    try:
        token_lists = conllu.parse("\n".join(block) + "\n\n")
    except Exception as e:  # conllu raises several types; all mean "malformed"
        raise DataError(f"{path}:{start}: malformed CoNLL-U sentence ({e})") from None
    tokens, tags = [], []
    for token_list in token_lists:
        for token in token_list:
            if not isinstance(token["id"], int):
                continue  # multiword range or empty node
            tokens.append(token["form"])
            tags.append(token["upos"])
    if not tokens:
        return None
    return TaggedSentence(tuple(tokens), tuple(tags))


def _check_row(path, number, line):
    fields = line.split("\t")
    if len(fields) != 10:
        raise DataError(
            f"{path}:{number}: malformed CoNLL-U line, expected 10 tab-separated columns, "
            f"got {len(fields)}: {line[:60]!r}"
        )
    row_id = fields[0]
    if _RANGE_ID.match(row_id) or _EMPTY_ID.match(row_id):
        return
    if not _WORD_ID.match(row_id):
        raise DataError(f"{path}:{number}: malformed CoNLL-U ID {row_id!r}")
    if not fields[1]:
        raise DataError(f"{path}:{number}: empty FORM column")
    upos = fields[3]
    if not upos or upos == "_" or any(c.isspace() for c in upos):
        raise DataError(f"{path}:{number}: missing UPOS tag {upos!r} for word {fields[1]!r}")
