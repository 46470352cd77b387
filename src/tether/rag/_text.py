"""Text analysis for the lexical retrievers: tokenizing, the stop list and stemming."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import lru_cache

# Lucene's classic English stop list (the one bm25s ships as "en"): small on purpose, so that
# long, descriptive queries keep their content words.
STOPWORDS: frozenset[str] = frozenset(
    ["a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they", "this", "to", "was", "will", "with"]
)

_WORD = re.compile(r"[a-z0-9]+")
# BM25's analysis follows bm25s/scikit-learn: words of two or more word characters (any script).
_WORD2 = re.compile(r"(?u)\b\w\w+\b")


def simple_tokens(text: str, stopwords: frozenset[str] = STOPWORDS) -> list[str]:
    """Lowercased `[a-z0-9]+` tokens minus the stop list (the textbook TF-IDF analysis)."""
    return [t for t in _WORD.findall(text.lower()) if t not in stopwords]


@lru_cache(maxsize=1)
def _stemmer() -> Callable[[Sequence[str]], list[str]]:
    import Stemmer  # PyStemmer (the `rag` extra)

    return Stemmer.Stemmer("english").stemWords


def word_tokens(text: str, stopwords: frozenset[str] = STOPWORDS) -> list[str]:
    """Lowercased words of two or more characters, minus the stop list."""
    return [t for t in _WORD2.findall(text.lower()) if t not in stopwords]


def stemmed_tokens(text: str, stopwords: frozenset[str] = STOPWORDS) -> list[str]:
    """`word_tokens` reduced by the Snowball English stemmer ("Refunds" and "refund" meet)."""
    return _stemmer()(word_tokens(text, stopwords))


def stem_many(texts: Sequence[str], stopwords: frozenset[str] = STOPWORDS) -> list[list[str]]:
    stem = _stemmer()
    return [stem(word_tokens(t, stopwords)) for t in texts]
