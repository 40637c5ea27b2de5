"""The embedded default data: a small generated English with real lexical ambiguity.

No download, deterministic for a seed. Words such as "saw", "book", "watch", "can" are
nouns or verbs, and "still", "just", "only", "even", "late" ... are adjectives inside a
noun phrase and adverbs before a verb. Which one a word is depends on the word that opened
its phrase (a determiner or a subject), and a chain of ambiguous modifiers can push that
word beyond a +-2 window:  "they still just only saw ."  vs  "I like the still just only saw ."
The test split also holds words that never occur in training (pseudo-words with English
suffixes), so only character features can tag them.
"""

import random

from train.tagger.types import TaggedSentence, TaggingData

# Noun/verb homographs: (form as noun, form as verb).
AMBIGUOUS_NV = (
    "saw book watch run duck fly park train play light fish ring race plant paint brush drink "
    "cook dance walk rock lock check film mark step store visit wave work"
).split()
# Adjective inside a noun phrase, adverb before a verb.
AMBIGUOUS_MOD = "still just only even early late fast hard daily pretty".split()
NOUNS = (
    "man woman dog cat girl boy teacher farmer table house car tree river city child doctor "
    "knife window letter garden horse bird door boat friend road song hammer kitchen apple can"
).split()
VERBS_PAST = "liked found took bought made kept wanted needed sold fixed".split()
VERBS_BASE = "see like find take buy make keep want need sell fix".split()
ADJECTIVES = "old big red new small sharp happy green quiet strong".split()
ADVERBS = "quickly often never rarely slowly always soon usually".split()
SUBJECT_PRONOUNS = "I you we they he she".split()
OBJECT_PRONOUNS = "me you us them him it".split()
DETERMINERS = "the a this every some my your our that".split()
PREPOSITIONS = "with in near under behind from on".split()
AUXILIARIES = "can will must should could may".split()
NUMBERS = "two three four five ten".split()
NAMES = "Anna Bob Maria Paris London Peter Sara Tom".split()
COORDINATORS = "and but".split()

_ONSETS = "b br d dr f fl g gr k kl m n p pl s st t tr v z sh ch l r".split()
_VOWELS = "a e i o u ai ea oo".split()
_SUFFIXES = {
    "NOUN": ["tion", "ment", "ness", "er", "ist", "ity", "ance"],
    "VERB": ["ized", "ated", "ified", "ened"],
    "ADJ": ["ous", "ful", "ive", "able", "ic"],
    "ADV": ["ously", "fully", "ively", "ably"],
    "PROPN": ["ova", "ington", "berg", "ston"],
}


def _pseudo_words(rng, tag, count, taken):
    words = []
    while len(words) < count:
        stem = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.randint(1, 2)))
        word = stem + rng.choice(_SUFFIXES[tag])
        if tag == "PROPN":
            word = word.capitalize()
        if word not in taken:
            taken.add(word)
            words.append(word)
    return words


class _Grammar:
    def __init__(self, rng, extra):
        self.rng = rng
        # extra: tag -> pseudo-words drawn from this split's pool.
        self.extra = extra

    def pick(self, words, tag, p_extra=0.25):
        if self.extra.get(tag) and self.rng.random() < p_extra:
            return self.rng.choice(self.extra[tag])
        return self.rng.choice(words)

    def modifiers(self, tag):
        """0-4 modifiers; ambiguous ones often chain, which defeats a small window."""
        out = []
        n = self.rng.choices([0, 1, 2, 3, 4], weights=[30, 25, 20, 15, 10])[0]
        for _ in range(n):
            if self.rng.random() < 0.6:
                out.append((self.rng.choice(AMBIGUOUS_MOD), tag))
            else:  # tag: ADJ or ADV
                out.append((self.pick(ADJECTIVES if tag == "ADJ" else ADVERBS, tag), tag))
        return out

    def noun(self):
        if self.rng.random() < 0.45:
            return (self.rng.choice(AMBIGUOUS_NV), "NOUN")
        return (self.pick(NOUNS, "NOUN"), "NOUN")

    def noun_phrase(self, allow_pp=True):
        r = self.rng.random()
        if r < 0.08:
            return [(self.pick(NAMES, "PROPN", 0.4), "PROPN")]
        if r < 0.14:
            return (
                [(self.rng.choice(NUMBERS), "NUM")]
                + self.modifiers("ADJ")
                + [(self.pick(NOUNS, "NOUN") + "s", "NOUN")]
            )
        np = [(self.rng.choice(DETERMINERS), "DET")] + self.modifiers("ADJ") + [self.noun()]
        if allow_pp and self.rng.random() < 0.2:
            np += [(self.rng.choice(PREPOSITIONS), "ADP")] + self.noun_phrase(allow_pp=False)
        return np

    def subject(self):
        if self.rng.random() < 0.5:
            return [(self.rng.choice(SUBJECT_PRONOUNS), "PRON")]
        return self.noun_phrase()

    def verb_phrase(self):
        rng = self.rng
        vp = []
        if rng.random() < 0.3:
            vp.append((rng.choice(AUXILIARIES), "AUX"))
            vp += self.modifiers("ADV")
            verb = rng.choice(AMBIGUOUS_NV) if rng.random() < 0.5 else self.pick(VERBS_BASE, "VERB")
        else:
            vp += self.modifiers("ADV")
            verb = (
                rng.choice(AMBIGUOUS_NV + ["saw"] * 4)
                if rng.random() < 0.5
                else self.pick(VERBS_PAST, "VERB")
            )
        vp.append((verb, "VERB"))
        r = rng.random()
        if r < 0.55:
            vp += self.noun_phrase()
        elif r < 0.7:
            vp.append((rng.choice(OBJECT_PRONOUNS), "PRON"))
        elif r < 0.78:
            vp += [("that", "SCONJ")] + self.clause()
        return vp

    def clause(self):
        return self.subject() + self.verb_phrase()

    def sentence(self):
        rng = self.rng
        if rng.random() < 0.04:
            # The lecture's example and its relatives: PRON VERB DET NOUN.
            words = [
                (rng.choice(SUBJECT_PRONOUNS), "PRON"),
                (rng.choice(AMBIGUOUS_NV), "VERB"),
                (rng.choice(DETERMINERS[:3]), "DET"),
                (rng.choice(AMBIGUOUS_NV), "NOUN"),
            ]
        else:
            words = self.clause()
            if rng.random() < 0.15:
                words += [(",", "PUNCT"), (rng.choice(COORDINATORS), "CCONJ")] + self.clause()
        rng.random()  # drawn and unused: every seed's sentences depend on this draw
        first, tag = words[0]
        if tag != "PROPN" and first != "I":
            words[0] = (first.capitalize(), tag)
        words.append((".", "PUNCT"))
        return TaggedSentence(tuple(w for w, _ in words), tuple(t for _, t in words))


def generate(seed=0, train_size=2000, dev_size=300, test_size=400):
    """Returns `TaggingData` with train/dev/test generated from `seed`.

    Pseudo-words with English suffixes come from three disjoint pools (train, dev, test),
    so dev and test contain words never seen in training.
    """
    rng = random.Random(seed)
    taken = set(AMBIGUOUS_NV + AMBIGUOUS_MOD + NOUNS + VERBS_PAST + ADJECTIVES + ADVERBS)
    pools = [
        {tag: _pseudo_words(rng, tag, 12 if tag == "PROPN" else 30, taken) for tag in _SUFFIXES}
        for _ in range(3)
    ]
    sizes = [train_size, dev_size, test_size]
    splits = []
    for pool, size in zip(pools, sizes):
        grammar = _Grammar(random.Random(rng.getrandbits(64)), pool)
        splits.append([grammar.sentence() for _ in range(size)])
    return TaggingData(*splits, {"name": "embedded", "seed": seed, "sizes": sizes})
