"""Response safety filter: weighted rules -> a score in [0, 1] -> flagged above a threshold.

Each rule returns (matched, weight, reason). Scores combine as a noisy-or, `1 - prod(1 - w)`,
so one strong rule or several weak ones flag a text and more matches never lower the score.
`strictness` moves the threshold (strict flags more). Verdicts are cached in a bounded LRU keyed by
a hash of the text and of the rule set; the reasons of the matched rules are the explanation.
`INPUT_RULES` screen a user's request, `OUTPUT_RULES` a final answer (`Agent(input_filter=...,
output_filter=...)`, docs/safety.md); `DEFAULT_RULES` suit retrieved text.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, cast

from tether._errors import InvalidInput
from tether.policy._output_filter import scan

Strictness = Literal["lenient", "standard", "strict"]
THRESHOLDS: dict[str, float] = {"lenient": 0.8, "standard": 0.6, "strict": 0.35}
STRICTNESS_CHOICES = ("off", *THRESHOLDS)  # as the CLI and the service's TOML spell them


@dataclass(frozen=True, slots=True)
class RuleResult:
    matched: bool
    weight: float
    reason: str


@dataclass(frozen=True, slots=True)
class Rule:
    """A named check. `test` is a regex (matched case-insensitively) or a function of the text that
    returns whether it matched (or a whole `RuleResult`, or a `(matched, weight, reason)` tuple)."""

    name: str
    test: str | Callable[[str], Any]
    weight: float
    reason: str
    _rx: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.weight <= 1.0:
            raise InvalidInput(f"rule {self.name!r}: weight must be in [0, 1], got {self.weight}")
        if isinstance(self.test, str):
            object.__setattr__(self, "_rx", re.compile(self.test, re.IGNORECASE))

    def __call__(self, text: str) -> RuleResult:
        if self._rx is not None:
            hit = self._rx.search(text) is not None
        else:
            got = cast("Callable[[str], Any]", self.test)(text)  # no pattern: a function
            if isinstance(got, RuleResult):
                return got
            if isinstance(got, tuple):
                matched, weight, reason = got  # pyright: ignore[reportUnknownVariableType]
                return RuleResult(bool(matched), float(weight) if matched else 0.0, str(reason))  # pyright: ignore[reportUnknownArgumentType]
            hit = bool(got)
        return RuleResult(hit, self.weight if hit else 0.0, self.reason)

    @property
    def identity(self) -> str:
        """What makes this rule this rule, for the cache key (a function: by its identity)."""
        test = self.test if isinstance(self.test, str) else f"fn:{id(self.test)}"
        return f"{self.name}\x00{test}\x00{self.weight}\x00{self.reason}"


@dataclass(frozen=True, slots=True)
class SafetyVerdict:
    score: float
    threshold: float
    reasons: tuple[str, ...]
    matched: tuple[str, ...]  # rule names
    cached: bool = False  # answered from the cache (no rule ran)

    @property
    def flagged(self) -> bool:
        return self.score >= self.threshold


def _has_secret(text: str) -> bool:
    return any(f.kind == "secret" for _, _, f in scan(text))


def _exfil_link(text: str) -> bool:
    """An image a viewer would fetch, or a URL carrying an encoded blob, on another host (a relative
    image path fetches nothing outside)."""
    return any(f.kind in ("markdown_image", "html_image", "encoded_url") and "//" in text[start:end]
               for start, end, f in scan(text))


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


def phrase_rule(phrases: Iterable[str], *, name: str = "refuse_list", weight: float = 1.0,
                reason: str = "matches a phrase on the refuse list") -> Rule:
    """One rule matching any of `phrases` (case-insensitive, any run of spaces between words); with
    the default weight 1.0 a match refuses at every strictness."""
    words = [r"\s+".join(re.escape(w) for w in p.split()) for p in phrases if p.strip()]
    if not words:
        raise InvalidInput(f"rule {name!r}: give at least one phrase")
    return Rule(name, r"\b(?:" + "|".join(words) + r")\b", weight, reason)


REFUSE_PHRASES: tuple[str, ...] = (
    "ignore previous instructions", "ignore all previous instructions", "ignore all prior instructions",
    "disregard previous instructions", "disregard all previous instructions", "ignore your instructions",
    "ignore the above instructions", "do anything now", "developer mode enabled",
)

# A user's request. Weights tuned on bench/safety_filter/requests.jsonl (benign coding and ops
# requests that say "ignore", "password", "delete", "system prompt" for good reasons) and checked on a
# held-out set: a user overriding their *own* earlier words ("ignore my previous instructions") is
# not an override; words that are also ordinary tech ("developer mode", "[INST]") weigh little alone.
INPUT_RULES: tuple[Rule, ...] = (
    phrase_rule(REFUSE_PHRASES),
    Rule("override", r"\b(?:ignore|disregard|forget|bypass|override)\b(?!\s+(?:my|our)\b)[^.\n]{0,40}"
         r"\b(?:previous|prior|above|earlier|preceding|your|all)\b[^.\n]{0,20}"
         r"\b(?:instructions?|prompts?|directions|guidelines)\b"
         r"|\b(?:ignore|disregard|forget|bypass)\b[^.\n]{0,20}\byour (?:rules|guidelines|restrictions|programming|"
         r"safety|filters?)|\bforget everything you (?:were|have been) told", 0.85,
         "tries to override earlier instructions"),
    Rule("role_hijack", r"\byou are no longer\b|\bact as (?:an? )?(?:unrestricted|unfiltered|jailbroken|evil)"
         r"|\bpretend (?:that )?you (?:have no|are not bound|don't have)|(?-i:\bDAN\b)"
         r"|\bno (?:ethical|moral) (?:guidelines|constraints|restrictions)", 0.75,
         "tries to change the assistant's role"),
    Rule("role_words", r"\byou are now\b|\bjailbr(?:eak|oken)|\bdeveloper mode\b"
         r"|\bwithout (?:any )?(?:restrictions|filters|censorship|limitations)\b", 0.3,
         "uses words of role-change attempts"),
    Rule("system_prompt", r"\b(?:reveal|print|show|repeat|leak|output|tell me|what is|what's|give me)\b.{0,30}"
         r"\byour (?:system prompt|initial prompt|hidden instructions|original instructions)", 0.75,
         "asks for the system prompt"),
    Rule("prompt_words", r"\b(?:reveal|print|show|repeat|leak|output)\b.{0,30}\b(?:your (?:instructions|rules)|"
         r"(?:the )?(?:text|words|everything) above)", 0.3, "asks to repeat instructions or earlier text"),
    Rule("secrecy", r"\b(?:do not|don't|never) (?:tell|inform|mention|reveal)\b.{0,30}\b(?:user|anyone|human)\b",
         0.5, "asks to hide actions from the user"),
    Rule("exfil_verbs", r"\b(?:send|forward|post|upload|transfer|email)\b.{0,60}\b(?:password|credentials?|api key|"
         r"secret|token|security code|iban|credit card)", 0.5, "asks to send credentials or financial data"),
    Rule("fake_markup", r"<\|im_start\|>\s*system|<<SYS>>|<\|system\|>", 0.7, "carries chat-format system markers"),
    Rule("markup_words", r"<\|im_(?:start|end)\|>|<\|endoftext\|>|\[/?INST\]|<\s*/?\s*system\s*>", 0.3,
         "carries chat-format control tokens"),
    Rule("new_instructions", r"\b(?:new|updated|important) (?:instructions?|orders)\b", 0.3,
         "announces new instructions"),
    Rule("malware", r"\b(?:write|create|build|make|code|develop)\b\s+(?:me\s+)?(?:an?\s+|some\s+)?(?:[\w-]+\s+){0,2}"
         r"(?:ransomware|keylogger|malware|botnet|credential stealer|rootkit)\b", 0.7, "asks for malicious software"),
)

# A final answer (after the policy's redaction): what should not reach the user even so.
OUTPUT_RULES: tuple[Rule, ...] = (
    Rule("secret", _has_secret, 0.8, "contains what looks like a secret"),
    Rule("exfil_link", _exfil_link, 0.8, "contains an image or link that would send data outside"),
    Rule("prompt_leak", r"\bmy (?:system prompt|hidden instructions|initial instructions|instructions)\b.{0,20}"
         r"\b(?:is|are|says|reads)\b|\bhere (?:is|are) my (?:system prompt|instructions)", 0.75,
         "reveals the system prompt"),
    Rule("jailbroken", r"\bdeveloper mode (?:enabled|output)|\U0001F513|(?-i:\bDAN:)|\bas an? (?:unrestricted|"
         r"unfiltered|jailbroken) (?:ai|assistant|model)\b|\bi have no (?:restrictions|ethical guidelines)",
         0.85, "speaks as a jailbroken persona"),
    Rule("sent_secret", r"\b(?:i have|i've|i)\b.{0,20}\b(?:sent|forwarded|emailed|uploaded|posted)\b.{0,60}"
         r"\b(?:password|credentials?|api key|secret|token|security code)", 0.6,
         "says it sent credentials somewhere"),
    Rule("destructive", r"\brm\s+-(?:rf|fr|r\s+-f)\s+(?:/|~|\$HOME)(?:\s|$|\*|`)|:\(\)\s*\{\s*:\|:&\s*\};:"
         r"|\bmkfs(?:\.\w+)?\s+/dev/[sh]d|\bdd\s+if=/dev/(?:zero|u?random)\s+of=/dev/[sh]d", 0.7,
         "suggests a command that destroys a system"),
)

RuleLike: TypeAlias = "Rule | str | Callable[[str], Any]"


def as_rule(item: RuleLike) -> Rule:
    """A user's rule: a `Rule`, a regex (matched case-insensitively; a match refuses), or a plain
    function of the text returning a bool (True refuses), a `RuleResult` or `(matched, weight, reason)`."""
    if isinstance(item, Rule):
        return item
    if isinstance(item, str):
        return Rule(f"pattern:{item}", item, 1.0, f"matches the pattern {item!r}")
    if callable(item):
        name = getattr(item, "__name__", type(item).__name__)
        doc = (getattr(item, "__doc__", None) or "").strip().splitlines()
        return Rule(name, item, 1.0, doc[0] if doc else f"matched the rule {name}")
    raise InvalidInput(f"a filter rule is a Rule, a regex or a function of the text, got {type(item).__name__}")


@dataclass(frozen=True, slots=True)
class _Entry:
    score: float
    reasons: tuple[str, ...]
    matched: tuple[str, ...]
    rules: tuple[Rule, ...]  # held so no function rule's id is reused while its verdicts are cached


class VerdictCache:
    """A bounded LRU of verdicts keyed by the rule set and a SHA-256 of the text (thread-safe; one can
    serve many filters: the threshold is not part of what it keeps)."""

    def __init__(self, size: int = 4096) -> None:
        if size < 0:
            raise InvalidInput(f"cache size must be >= 0, got {size}")
        self.size = size
        self._data: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: str) -> _Entry | None:
        with self._lock:
            entry = self._data.get(key)
            if entry is not None:
                self._data.move_to_end(key)
            return entry

    def put(self, key: str, entry: _Entry) -> None:
        if self.size == 0:
            return
        with self._lock:
            self._data[key] = entry
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


SHARED_CACHE = VerdictCache(8192)  # the agents' filters share it: the service builds an agent per task


class SafetyFilter:
    """Score texts against rules; `check(text)` is cached by the rule set and a SHA-256 of the text.

    `rules`: `Rule`s, regexes or plain functions (`as_rule`); `refuse`: phrases that refuse at every
    strictness; `cache`: a `VerdictCache` to share (else one of `cache_size` entries of its own)."""

    def __init__(self, rules: Iterable[RuleLike] = DEFAULT_RULES, *, strictness: Strictness | float = "standard",
                 cache_size: int = 4096, refuse: Iterable[str] = (), cache: VerdictCache | None = None,
                 name: str = "") -> None:
        self.rules = tuple(as_rule(r) for r in rules)
        phrases = tuple(refuse)
        if phrases:
            self.rules += (phrase_rule(phrases),)
        if isinstance(strictness, str):
            if strictness not in THRESHOLDS:
                raise InvalidInput(f"strictness must be one of {sorted(THRESHOLDS)} or a number, got {strictness!r}")
            self.threshold = THRESHOLDS[strictness]
            self.strictness: str = strictness
        else:
            if not 0.0 < strictness <= 1.0:
                raise InvalidInput(f"threshold must be in (0, 1], got {strictness}")
            self.threshold = float(strictness)
            self.strictness = str(self.threshold)
        self.name = name
        self.cache = cache if cache is not None else VerdictCache(cache_size)
        self.cache_size = self.cache.size
        self._ruleset = hashlib.sha256("\x01".join(r.identity for r in self.rules).encode("utf-8",
                                                                                            "surrogatepass")).hexdigest()
        self.hits = 0
        self.misses = 0

    def evaluate(self, text: str) -> list[tuple[Rule, RuleResult]]:
        """Every rule's result, uncached (for explanations and debugging)."""
        return [(rule, rule(text)) for rule in self.rules]

    def check(self, text: str) -> SafetyVerdict:
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        key = f"{self._ruleset}:{digest}"
        entry = self.cache.get(key)
        if entry is not None:  # the key names the rule set (its functions by id, kept alive by the entry)
            self.hits += 1
            return SafetyVerdict(entry.score, self.threshold, entry.reasons, entry.matched, cached=True)
        self.misses += 1
        keep = 1.0
        reasons: list[str] = []
        names: list[str] = []
        for rule, res in self.evaluate(text):
            if res.matched:
                keep *= 1.0 - res.weight
                reasons.append(res.reason)
                names.append(rule.name)
        entry = _Entry(round(1.0 - keep, 6), tuple(reasons), tuple(names), self.rules)
        self.cache.put(key, entry)
        return SafetyVerdict(entry.score, self.threshold, entry.reasons, entry.matched)


FilterSpec: TypeAlias = "SafetyFilter | Strictness | float | bool | Iterable[RuleLike] | None"


def input_filter(strictness: Strictness | float = "standard", *, extra: Iterable[RuleLike] = (),
                 refuse: Iterable[str] = ()) -> SafetyFilter:
    """The shipped rule set for a user's request (`INPUT_RULES`), plus `extra` rules and phrases."""
    return SafetyFilter((*INPUT_RULES, *extra), strictness=strictness, refuse=refuse, cache=SHARED_CACHE,
                        name="input")


def output_filter(strictness: Strictness | float = "standard", *, extra: Iterable[RuleLike] = (),
                  refuse: Iterable[str] = ()) -> SafetyFilter:
    """The shipped rule set for a final answer (`OUTPUT_RULES`), plus `extra` rules and phrases."""
    return SafetyFilter((*OUTPUT_RULES, *extra), strictness=strictness, refuse=refuse, cache=SHARED_CACHE,
                        name="output")


def as_filter(spec: Any, side: Literal["input", "output"]) -> SafetyFilter | None:
    """An `Agent`'s `input_filter` / `output_filter` value as a filter: None, False or "off" (none);
    True (the shipped rules, standard); a strictness or threshold (the shipped rules at it); a
    `SafetyFilter`; or a list of your own rules (regexes or functions), checked at standard strictness."""
    if spec is None or spec is False or spec == "off":
        return None
    make = input_filter if side == "input" else output_filter
    if isinstance(spec, SafetyFilter):
        return spec
    if spec is True:
        return make()
    if isinstance(spec, str | int | float):
        if isinstance(spec, str) and spec not in THRESHOLDS:
            raise InvalidInput(f"{side}_filter: strictness must be one of {list(STRICTNESS_CHOICES)}, got {spec!r}")
        return make(cast("Strictness | float", spec))  # a str is one of THRESHOLDS (checked above)
    if isinstance(spec, Iterable) or callable(spec):
        rules = [spec] if callable(spec) or isinstance(spec, Rule) else list(spec)  # pyright: ignore[reportUnknownArgumentType]
        return SafetyFilter(rules, strictness="standard", cache=SHARED_CACHE, name=side)  # pyright: ignore[reportUnknownArgumentType]
    raise InvalidInput(f"{side}_filter must be a SafetyFilter, a strictness, True/False or a list of rules, "
                       f"got {type(spec).__name__}")
