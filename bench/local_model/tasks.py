"""The offline task suite: each task is a few prompt variants with known answers.

Files live in a temporary workspace written by `make_workspace`; the expected strings must all
appear in the answer (case-insensitive, digits compared without thousands separators).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Variant:
    prompt: str
    expected: tuple[str, ...]  # every one must appear in the answer


@dataclass(frozen=True, slots=True)
class Task:
    name: str
    description: str
    tools: str  # which tool set the harness gives: calculator | files | rag
    variants: tuple[Variant, ...]


def _v(prompt: str, *expected: str) -> Variant:
    return Variant(prompt, tuple(expected))


CALCULATOR = Task(
    "calculator",
    "one calculator call, then answer with the result",
    "calculator",
    (
        _v("What is 17 * 23?", "391"),
        _v("What is 1234 + 4321?", "5555"),
        _v("What is 2 ** 10?", "1024"),
        _v("What is 156 / 12?", "13"),
        _v("What is 999 - 457?", "542"),
        _v("Calculate 15 * 15.", "225"),
        _v("What is 7 * 8 * 9?", "504"),
        _v("What is 3.5 * 4?", "14"),
    ),
)

FILES: dict[str, str] = {
    "config.ini": "[server]\nhost = 0.0.0.0\nport = 8421\nworkers = 3\n",
    "notes/meeting.txt": "The planning meeting moved to Thursday at 10 am in room Cedar.\n",
    "team/owner.txt": "The billing service is owned by Priya Raman.\n",
    "inventory.csv": "item,count\nbolts,120\nnuts,75\nwashers,300\n",
    "pets/alice.txt": "Alice has a dog called Biscuit.\n",
    "pets/bob.txt": "Bob has a cat called Pepper.\n",
    "version.txt": "tether-demo version 4.2.1\n",
    "city/a.txt": "Lyon has 522,000 inhabitants.\n",
    "city/b.txt": "Nantes has 320,000 inhabitants.\n",
    "release/date.txt": "The release is planned for 14 March.\n",
    "release/codename.txt": "The release codename is Lantern.\n",
    "shop/open.txt": "The shop opens at 9:00.\n",
    "shop/close.txt": "The shop closes at 18:30.\n",
}

READ_ONE = Task(
    "read_one_file",
    "read one named file, answer from it",
    "files",
    (
        _v("What port is set in config.ini? Read the file.", "8421"),
        _v("Read notes/meeting.txt. On what day is the planning meeting?", "thursday"),
        _v("Who owns the billing service? The answer is in team/owner.txt.", "priya"),
        _v("Read inventory.csv and tell me how many washers there are.", "300"),
        _v("What version is in version.txt?", "4.2.1"),
        _v("Read pets/alice.txt. What is the name of Alice's dog?", "biscuit"),
        _v("Read config.ini. What host does the server use?", "0.0.0.0"),
        _v("Read release/codename.txt. What is the release codename?", "lantern"),
    ),
)

READ_TWO = Task(
    "read_two_files",
    "read two named files, answer from both",
    "files",
    (
        _v("Read pets/alice.txt and pets/bob.txt. What are the names of their pets?", "biscuit", "pepper"),
        _v("Read city/a.txt and city/b.txt. How many inhabitants do Lyon and Nantes have?", "522000", "320000"),
        _v("Read release/date.txt and release/codename.txt. When is the release and what is its codename?",
           "14 march", "lantern"),
        _v("Read shop/open.txt and shop/close.txt. When does the shop open and close?", "9:00", "18:30"),
        _v("Read config.ini and version.txt. What is the port and the version?", "8421", "4.2.1"),
        _v("Read team/owner.txt and notes/meeting.txt. Who owns billing, and in which room is the meeting?",
           "priya", "cedar"),
    ),
)

# Known answers in examples/support_rag's knowledge base are filled in by the harness when the
# retrieval example is installed (see harness.rag_task).
TASKS: tuple[Task, ...] = (CALCULATOR, READ_ONE, READ_TWO)


def make_workspace(root: Path) -> Path:
    for rel, text in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def _norm(text: str) -> str:
    text = text.lower()
    return re.sub(r"(?<=\d)[,\u202f ](?=\d{3}\b)", "", text)  # 522,000 -> 522000


def check(answer: str, expected: tuple[str, ...]) -> bool:
    """True when every expected string appears in the answer."""
    norm = _norm(answer)
    return all(re.search(rf"(?<![0-9a-z]){re.escape(_norm(e))}(?![0-9a-z]|\.\d)", norm) for e in expected)
