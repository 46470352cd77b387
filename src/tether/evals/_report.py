"""A suite report as a terminal table, JSON, or a self-contained HTML page; and what changed
between two reports."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tether._errors import InvalidInput
from tether._terminal import clean

COLUMNS = [("steps", "steps"), ("input_tokens", "in tok"), ("output_tokens", "out tok"), ("cost_usd", "cost $"),
           ("side_effect_requests", "effects asked"), ("unnecessary_side_effect_requests", "unneeded"),
           ("approvals_requested", "approvals"), ("safety_violations", "violations")]


def print_table(report: dict[str, Any], console: Console) -> None:
    table = Table(title=Text(clean(f"{report['suite']} ({report['mode']})")), show_lines=False)
    table.add_column("scenario")
    table.add_column("ok")
    for _, label in COLUMNS:
        table.add_column(label, justify="right")
    table.add_column("caught by")
    table.add_column("why not")
    for row in report["scenarios"]:
        # failures quote model output: Text (no rich markup) through the one terminal sanitiser
        table.add_row(Text(clean(row["id"])), "yes" if row["success"] else "NO", *(_fmt(row[k]) for k, _ in COLUMNS),
                      Text(clean(", ".join(row["caught_by"]))), Text(clean("; ".join(row["failures"])[:160])))
    t = report["totals"]
    table.add_row("total", f"{t['passed']}/{t['scenarios']}", *(_fmt(t[k]) for k, _ in COLUMNS), "", "")
    console.print(table)


def _fmt(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def write_json(report: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", "utf-8")


def load_report(path: str | Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"cannot read report {path}: {exc}") from exc
    if not isinstance(data, dict) or "scenarios" not in data:
        raise InvalidInput(f"{path} is not a tether eval report (--json output)")
    return data


def compare(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """One line per scenario whose outcome or cost moved, then the totals."""
    before = {r["id"]: r for r in old["scenarios"]}
    lines: list[str] = []
    for row in new["scenarios"]:
        prev = before.pop(row["id"], None)
        if prev is None:
            lines.append(f"+ {row['id']}: new scenario, {'passes' if row['success'] else 'fails'}")
            continue
        if prev["success"] != row["success"]:
            lines.append(f"{'fixed' if row['success'] else 'BROKE'} {row['id']}"
                         + ("" if row["success"] else f": {'; '.join(row['failures'])[:160]}"))
        for key in ("input_tokens", "steps", "safety_violations", "unnecessary_side_effect_requests"):
            if prev.get(key) != row.get(key):
                lines.append(f"  {row['id']}: {key} {prev.get(key)} -> {row.get(key)}")
    lines += [f"- {sid}: scenario removed" for sid in before]
    ot, nt = old["totals"], new["totals"]
    lines.append(f"passed {ot['passed']}/{ot['scenarios']} -> {nt['passed']}/{nt['scenarios']}; input tokens "
                 f"{ot['input_tokens']} -> {nt['input_tokens']}; violations {ot['safety_violations']} -> "
                 f"{nt['safety_violations']}")
    return lines


def _bars(rows: list[dict[str, Any]], key: str, title: str) -> str:
    top = max((r[key] for r in rows), default=0) or 1
    h = 18
    parts = [f'<svg width="720" height="{len(rows) * h + 30}" role="img" aria-label="{html.escape(title)}">',
             f'<text x="0" y="14" font-weight="bold">{html.escape(title)}</text>']
    for i, r in enumerate(rows):
        y = 24 + i * h
        w = int(440 * r[key] / top)
        color = "#2e7d32" if r["success"] else "#c62828"
        parts.append(f'<text x="0" y="{y + 12}" font-size="12">{html.escape(r["id"][:32])}</text>'
                     f'<rect x="230" y="{y}" width="{w}" height="{h - 4}" fill="{color}"/>'
                     f'<text x="{236 + w}" y="{y + 12}" font-size="12">{_fmt(r[key])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def write_html(report: dict[str, Any], path: str | Path) -> None:
    """One page, no scripts or fetched assets: a summary, charts and the per-scenario table."""
    rows = report["scenarios"]
    t = report["totals"]
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label in COLUMNS)
    body = "".join(
        f"<tr class={'ok' if r['success'] else 'bad'}><td>{html.escape(r['id'])}</td>"
        f"<td>{'yes' if r['success'] else 'NO'}</td>" + "".join(f"<td>{_fmt(r[k])}</td>" for k, _ in COLUMNS)
        + f"<td>{html.escape(', '.join(r['caught_by']))}</td><td>{html.escape('; '.join(r['failures']))}</td><td>{html.escape(r['answer'][:200])}</td></tr>"
        for r in rows)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(report['suite'])}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;
padding:3px 6px;font-size:13px}}tr.bad td{{background:#fde0e0}}</style></head><body>
<h1>{html.escape(report['suite'])}: {t['passed']}/{t['scenarios']} passed</h1>
<p>mode {html.escape(report['mode'])}; safety violations {t['safety_violations']}; unneeded side-effect requests
{t['unnecessary_side_effect_requests']}; approvals asked {t['approvals_requested']}; input tokens {t['input_tokens']};
cost ${t['cost_usd']:.4f}; drifted scenarios {t['drifted']}</p>
{_bars(rows, 'input_tokens', 'input tokens per scenario')}
{_bars(rows, 'steps', 'steps per scenario')}
<table><tr><th>scenario</th><th>ok</th>{head}<th>caught by</th><th>why not</th><th>answer</th></tr>{body}</table></body></html>
"""
    Path(path).write_text(page, "utf-8")
