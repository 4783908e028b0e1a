"""The tiny models' language: generated sentences, the tokenizers' training corpus and the prompts."""

from __future__ import annotations

import random

_WORD_TEXT = (
    "the of and to in is was that for on as with by at from his her they this which be or an are had not "
    "one but all were when there can more has their if would will what about out up into them some time "
    "only other new could its two first over than been these may then do like so people any most after "
    "made also did many before must through back years where much your way well down should because each "
    "just those how too little state good very make world still own see men work long get here between "
    "both life being under never day same another know while last might great old year off come since "
    "against go came right used take three engine token draft model cache block memory speed verify "
    "accept reject batch queue latency window signal metric alert river stone garden window light "
)
_WORDS = _WORD_TEXT.split()


def _lexicon() -> list[str]:
    """English function words plus seeded pseudo-words, enough for the BPE to fill its vocabulary."""
    rng = random.Random(1)
    onsets = "b c d f g h j k l m n p r s t v w z br cl dr fl gr pl st tr sh ch th"
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st"]
    pseudo = {
        "".join(rng.choice(onsets.split()) + rng.choice(vowels) + rng.choice(codas) for _ in range(rng.randint(1, 3)))
        for _ in range(4000)
    }
    return list(_WORDS) + sorted(pseudo)


def corpus(seed: int, lines: int = 6000) -> list[str]:
    """``lines`` sentences of the lexicon's words, from ``seed``."""
    rng = random.Random(seed)
    words = _lexicon()
    rng.shuffle(words)
    # A Zipf-like choice makes frequent words merge first, as in real text.
    weights = [1.0 / (i + 1) for i in range(len(words))]
    out = []
    for _ in range(lines):
        n = rng.randint(6, 18)
        sentence = " ".join(rng.choices(words, weights, k=n))
        out.append(sentence.capitalize() + rng.choice([".", ".", "?", "!"]))
    return out


def prompts(count: int, seed: int = 0, min_words: int = 4, max_words: int = 40) -> list[str]:
    """Deterministic prompts in the tiny models' language, of varied lengths."""
    rng = random.Random(seed)
    lines = corpus(seed=1000 + seed, lines=count)
    return [" ".join(line.split()[: rng.randint(min_words, max_words)]) for line in lines]
