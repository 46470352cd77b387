"""Audit log: every guarded call with its arguments, their provenance, the decision and outcome.

`AuditLog` keeps records in memory (queryable per run) and writes each to its sinks as it
happens: `JsonlSink` (one JSON object a line) and `SqliteSink` (a table, queryable per run).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass(slots=True)
class AuditRecord:
    run_id: str
    tool: str
    decision: str  # allowed | approved | refused | denied | awaiting_approval | deferred | answer
    call_id: str = ""
    user: str | None = None
    step: int = 0
    arguments: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, str] = field(default_factory=dict)
    effect: str = ""
    by: str = ""  # who approved or denied
    reason: str = ""
    outcome: str = ""  # ok | error | not_run
    detail: str = ""  # excerpt of the result or error
    tainted: bool = False
    t: float = field(default_factory=time.time)
    batch: str = ""  # the approval batch (calls of one turn asked about together) that decided it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class AuditSink(Protocol):
    def write(self, record: AuditRecord) -> None: ...


class JsonlSink:
    """Appends one JSON line per record."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def write(self, record: AuditRecord) -> None:
        line = json.dumps(record.to_dict(), ensure_ascii=False, default=str)
        if not _utf8_ok(line):  # lone surrogates: escape them so the line is valid UTF-8 and reads back
            line = json.dumps(record.to_dict(), default=str)
        with self._lock, self.path.open("a", encoding="utf-8") as fh:
            fh.write(line + "\n")

    def read(self, run_id: str | None = None) -> list[AuditRecord]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = AuditRecord(**json.loads(line))
                if run_id is None or rec.run_id == run_id:
                    out.append(rec)
        return out


_COLUMNS = [f for f in AuditRecord.__dataclass_fields__]


def _utf8_ok(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class SqliteSink:
    """Writes records to an `audit` table (JSON columns for arguments and provenance)."""

    def __init__(self, path: str | Path) -> None:
        self._db = sqlite3.connect(str(path), check_same_thread=False)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS audit (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, tool TEXT,"
                " decision TEXT, call_id TEXT, user TEXT, step INTEGER, arguments TEXT, provenance TEXT,"
                " effect TEXT, by TEXT, reason TEXT, outcome TEXT, detail TEXT, tainted INTEGER, t REAL, batch TEXT)")
            if "batch" not in {row[1] for row in self._db.execute("PRAGMA table_info(audit)")}:
                self._db.execute("ALTER TABLE audit ADD COLUMN batch TEXT DEFAULT ''")  # written before batches
            self._db.execute("CREATE INDEX IF NOT EXISTS audit_run ON audit(run_id)")
            self._db.commit()

    def write(self, record: AuditRecord) -> None:
        d = record.to_dict()
        d["arguments"] = json.dumps(d["arguments"], ensure_ascii=False, default=str)
        d["provenance"] = json.dumps(d["provenance"])
        d["tainted"] = int(d["tainted"])
        for k, v in d.items():  # SQLite text must be valid UTF-8
            if isinstance(v, str) and not _utf8_ok(v):
                d[k] = v.encode("utf-8", "backslashreplace").decode("utf-8")
        with self._lock:
            self._db.execute(f"INSERT INTO audit ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})",
                             [d[c] for c in _COLUMNS])
            self._db.commit()

    def query(self, run_id: str | None = None, decision: str | None = None) -> list[AuditRecord]:
        sql = f"SELECT {', '.join(_COLUMNS)} FROM audit WHERE 1=1"
        params: list[Any] = []
        if run_id is not None:
            sql += " AND run_id = ?"
            params.append(run_id)
        if decision is not None:
            sql += " AND decision = ?"
            params.append(decision)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY id", params).fetchall()
        out = []
        for row in rows:
            d = dict(zip(_COLUMNS, row, strict=True))
            d["arguments"] = json.loads(d["arguments"])
            d["provenance"] = json.loads(d["provenance"])
            d["tainted"] = bool(d["tainted"])
            d["batch"] = d["batch"] or ""
            out.append(AuditRecord(**d))
        return out

    def close(self) -> None:
        self._db.close()


class AuditLog:
    """In-memory records (bounded) plus any sinks; `query` filters by run, tool and decision."""

    def __init__(self, sinks: Iterable[AuditSink] = (), *, max_records: int = 100_000) -> None:
        self.sinks = list(sinks)
        self.max_records = max_records
        # the newest max_records; a deque drops the oldest in O(1) (trimming a full list moved all of them)
        self.records: deque[AuditRecord] = deque(maxlen=max_records)

    def record(self, rec: AuditRecord) -> None:
        self.records.append(rec)
        for sink in self.sinks:
            sink.write(rec)

    def query(self, run_id: str | None = None, *, tool: str | None = None,
              decision: str | None = None) -> list[AuditRecord]:
        return [r for r in self.records
                if (run_id is None or r.run_id == run_id) and (tool is None or r.tool == tool)
                and (decision is None or r.decision == decision)]
