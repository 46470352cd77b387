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
    held_out: bool = False  # written before the issue-10 work and never used to tune it


@dataclass(frozen=True, slots=True)
class Task:
    name: str
    description: str
    tools: str  # which tool set the harness gives: calculator | files | rag
    variants: tuple[Variant, ...]


def _v(prompt: str, *expected: str) -> Variant:
    return Variant(prompt, tuple(expected))


def _h(prompt: str, *expected: str) -> Variant:
    """A held-out variant: reported separately, never run while tuning prompts or grammars."""
    return Variant(prompt, tuple(expected), held_out=True)


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
        _h("What is 48 * 12?", "576"),
        _h("What is 12 * 12 - 4?", "140"),
        _h("How much is 1000 - 1?", "999"),
        _h("What is 6 * 7?", "42"),
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
    "recipes/soup.txt": "The tomato soup cooks for 25 minutes.\n",
    "office/wifi.txt": "The office wifi password is maple-77.\n",
    "garden/tree.txt": "The oak in the garden is 14 metres tall.\n",
    "house/door.txt": "The front door is painted green.\n",
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
        _h("Read recipes/soup.txt. How many minutes does the soup cook?", "25"),
        _h("What is the wifi password in office/wifi.txt?", "maple-77"),
        _h("Read garden/tree.txt. How tall is the oak?", "14"),
        _h("Which colour is the front door? See house/door.txt.", "green"),
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
        _h("Read office/wifi.txt and recipes/soup.txt. What is the wifi password and how long does the soup cook?",
           "maple-77", "25"),
        _h("Read garden/tree.txt and house/door.txt. How tall is the oak and what colour is the door?",
           "14", "green"),
        _h("Read pets/bob.txt and shop/open.txt. What is Bob's cat called and when does the shop open?",
           "pepper", "9:00"),
        _h("Read city/b.txt and version.txt. How many people live in Nantes, and what is the version?",
           "320000", "4.2.1"),
        _h("Read inventory.csv and team/owner.txt. How many bolts are there and who owns billing?",
           "120", "priya"),
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
    """True when every expected string appears in the answer ("13" also as "13.0", never as "13.5")."""
    norm = _norm(answer)
    return all(re.search(rf"(?<![0-9a-z]){re.escape(_norm(e))}(?:\.0+)?(?![0-9a-z]|\.\d)", norm) for e in expected)
