"""Plain containers shared by the tagging readers."""

import dataclasses

from zoo.cli import DataError


@dataclasses.dataclass(frozen=True)
class TaggedSentence:
    tokens: tuple
    tags: tuple  # one per token (every reader builds both from the same rows)


@dataclasses.dataclass
class TaggingData:
    """Train/dev/test splits plus where they came from (for config.json)."""

    train: list
    dev: list
    test: list
    source: dict

    def check_not_empty(self):
        for name in ("train", "dev", "test"):
            split = getattr(self, name)
            if not split or not any(s.tokens for s in split):
                origin = self.source.get(name) or self.source.get("name", "data")
                raise DataError(f"empty data set: the {name} split ({origin}) has no tagged words")
