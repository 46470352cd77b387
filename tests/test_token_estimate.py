"""The ASCII token estimate (`EstimateCounter._count_ascii`, linear-time string and big-int counts) gives
exactly the figure of the piece-by-piece estimate, and of the word-by-word loop it replaced."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from tether._tokens import _ASCII_CLASSES, _ASCII_GAPS, EstimateCounter


def word_by_word(counter: EstimateCounter, text: str) -> int:
    """The estimate as `_count_ascii` computed it before: a Python loop over words and digit runs."""
    classes = text.translate(_ASCII_CLASSES)
    words = 0.0
    for run in re.findall("a+", classes):
        n = len(run)
        words += 1 if n < 7 else 1 + (n - 6) / 6
    digits = float(sum(-(-len(run) // 3) for run in re.findall("d+", classes)))
    punct = float(classes.count("p"))
    breaks = float(classes.count("n") + len(_ASCII_GAPS.findall(classes)))
    w = counter.weights
    return max(1, round(words * w[0] + digits * w[1] + punct * w[2] + breaks * w[3]))


_PIECES = st.sampled_from(["a", "Zq", "internationalization", "abcdefg", "abcdefghi", "x" * 40, "7", "12",
                           "123", "1234", "1234567", " ", "  ", "\n", " \n ", "\t\t", "_", "-", "{}", '"', ":,", "."])
_TEXT = (st.lists(_PIECES, max_size=120).map("".join)
         | st.text(alphabet=st.characters(max_codepoint=127), max_size=300)
         | st.text(alphabet="abcdefgh12 \n.", min_size=1, max_size=2000))
_WEIGHT = st.floats(min_value=-3, max_value=3, allow_nan=False) | st.sampled_from([0.0, 0.5, 1.0, 1 / 6, 1 / 3])


@settings(max_examples=600, deadline=None)
@given(_TEXT, st.tuples(_WEIGHT, _WEIGHT, _WEIGHT, _WEIGHT) | st.just((0.976, 1.036, 0.624, 1.278)))
def test_the_linear_ascii_estimate_counts_exactly_as_the_word_by_word_loop(
        text: str, weights: tuple[float, float, float, float]) -> None:
    counter = EstimateCounter(weights)
    if not text:
        assert counter.count(text) == 0
        return
    expected = word_by_word(counter, text)
    assert counter._count_ascii(text) == expected  # pyright: ignore[reportPrivateUsage]
    assert counter._count_pieces(text) == expected  # pyright: ignore[reportPrivateUsage]


def test_a_total_on_a_rounding_boundary_is_summed_word_by_word() -> None:
    # one 9-letter word: 1 + 3/6 = 1.5 words, exactly a rounding boundary (round half to even: 2)
    counter = EstimateCounter((1.0, 0.0, 0.0, 0.0))
    assert counter._count_ascii("abcdefghi") == word_by_word(counter, "abcdefghi") == 2  # pyright: ignore[reportPrivateUsage]
    counter = EstimateCounter((3.0, 0.0, 0.0, 0.0))  # 4.5 words * 3 = 13.5 -> 14; 4 words: 12
    text = "abcdefghi abcdefghi abcdefghi"
    assert counter._count_ascii(text) == word_by_word(counter, text) == 14  # pyright: ignore[reportPrivateUsage]
