"""Response safety filter: weighted rules -> a score in [0, 1] -> flagged above a threshold.

Each rule returns (matched, weight, reason). Scores combine as a noisy-or, `1 - prod(1 - w)`,
so one strong rule or several weak ones flag a text and more matches never lower the score.
`strictness` moves the threshold (strict flags more). Verdicts are cached by a hash of the text;
the reasons of the matched rules are the explanation. Usable on input (prompts, retrieved text)
and on output (answers).
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from tether._errors import InvalidInput
from tether.policy._output_filter import scan

Strictness = Literal["lenient", "standard", "strict"]
THRESHOLDS: dict[str, float] = {"lenient": 0.8, "standard": 0.6, "strict": 0.35}


@dataclass(frozen=True, slots=True)
class RuleResult:
    matched: bool
    weight: float
    reason: str


@dataclass(frozen=True, slots=True)
class Rule:
    """A named check. `test` is a regex (matched case-insensitively) or a function of the text."""

    name: str
    test: str | Callable[[str], bool]
    weight: float
    reason: str
    _rx: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.weight <= 1.0:
            raise InvalidInput(f"rule {self.name!r}: weight must be in [0, 1], got {self.weight}")
        if isinstance(self.test, str):
            object.__setattr__(self, "_rx", re.compile(self.test, re.IGNORECASE))

    def __call__(self, text: str) -> RuleResult:
        hit = bool(self._rx.search(text)) if self._rx is not None else bool(self.test(text))  # type: ignore[operator]
        return RuleResult(hit, self.weight if hit else 0.0, self.reason)


@dataclass(frozen=True, slots=True)
class SafetyVerdict:
    score: float
    threshold: float
    reasons: tuple[str, ...]
    matched: tuple[str, ...]  # rule names

    @property
    def flagged(self) -> bool:
        return self.score >= self.threshold


def _has_secret(text: str) -> bool:
    return any(f.kind == "secret" for _, _, f in scan(text))


def _exfil_link(text: str) -> bool:
    return any(f.kind in ("markdown_image", "html_image", "encoded_url") for _, _, f in scan(text))


DEFAULT_RULES: tuple[Rule, ...] = (
    Rule("override", r"\b(ignore|disregard|forget)\b.{0,40}\b(previous|prior|above|earlier|all)\b.{0,20}"
         r"\b(instructions?|rules|prompts?|directions)", 0.7, "tries to override earlier instructions"),
    Rule("new_instructions", r"\b(new|updated|important) (instructions?|task|orders)\b|<\s*(information|instructions?|system)\s*>",
         0.35, "announces new instructions inside content"),
    Rule("role_hijack", r"\byou are (now|no longer)\b|\bact as (an? )?(unrestricted|developer|admin)|\bDAN\b|jailbreak",
         0.55, "tries to change the assistant's role"),
    Rule("secrecy", r"\b(do not|don't|never) (tell|inform|mention|reveal)\b.{0,30}\b(user|anyone|human)\b",
         0.5, "asks to hide actions from the user"),
    Rule("system_prompt", r"\b(reveal|print|show|repeat|leak)\b.{0,30}\b(system prompt|hidden instructions|your instructions)",
         0.5, "asks for the system prompt"),
    Rule("exfil_verbs", r"\b(send|forward|post|upload|transfer|email)\b.{0,60}\b(password|credentials?|api key|secret|token|"
         r"security code|iban|credit card)", 0.45, "asks to send credentials or financial data"),
    Rule("secret", _has_secret, 0.6, "contains what looks like a secret"),
    Rule("exfil_link", _exfil_link, 0.5, "contains an image or link that would send data outside"),
    Rule("urgency", r"\b(urgent|immediately|right now|before (you )?do(ing)? anything else)\b", 0.15,
         "pressures for immediate action"),
)


class SafetyFilter:
    """Score texts against rules; `check(text)` is cached by a SHA-256 of the text."""

    def __init__(self, rules: Iterable[Rule] = DEFAULT_RULES, *, strictness: Strictness | float = "standard",
                 cache_size: int = 4096) -> None:
        self.rules = tuple(rules)
        if isinstance(strictness, str):
            if strictness not in THRESHOLDS:
                raise InvalidInput(f"strictness must be one of {sorted(THRESHOLDS)} or a number, got {strictness!r}")
            self.threshold = THRESHOLDS[strictness]
        else:
            if not 0.0 < strictness <= 1.0:
                raise InvalidInput(f"threshold must be in (0, 1], got {strictness}")
            self.threshold = float(strictness)
        self.cache_size = cache_size
        self._cache: OrderedDict[str, SafetyVerdict] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def evaluate(self, text: str) -> list[tuple[Rule, RuleResult]]:
        """Every rule's result, uncached (for explanations and debugging)."""
        return [(rule, rule(text)) for rule in self.rules]

    def check(self, text: str) -> SafetyVerdict:
        key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        cached = self._cache.get(key)
        if cached is not None:
            self.hits += 1
            self._cache.move_to_end(key)
            return cached
        self.misses += 1
        keep = 1.0
        reasons: list[str] = []
        names: list[str] = []
        for rule, res in self.evaluate(text):
            if res.matched:
                keep *= 1.0 - res.weight
                reasons.append(res.reason)
                names.append(rule.name)
        verdict = SafetyVerdict(round(1.0 - keep, 6), self.threshold, tuple(reasons), tuple(names))
        self._cache[key] = verdict
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return verdict
