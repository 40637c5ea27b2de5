"""Data readers for the training CLIs.

Every tagging reader returns a list of `TaggedSentence` (tokens and their tags, words only:
multiword-range and empty-node rows never appear), so the model code never sees formats.
"""

from train.data.types import TaggedSentence, TaggingData

__all__ = ["TaggedSentence", "TaggingData"]
