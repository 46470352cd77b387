"""The support_rag task: search the example's policy documents, answer from the passages.

Used when the retrieval extra (`tether[rag]`) and examples/support_rag are present; the index is
lexical (BM25), built in a temporary folder, so nothing is downloaded.
"""

from __future__ import annotations

import atexit
import importlib.util
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench.local_model.tasks import Task, _h, _v
from tether.tools._base import Tool

DOCS = Path(__file__).resolve().parents[2] / "examples" / "support_rag" / "docs"

SUPPORT_RAG = Task(
    "search_support_rag",
    "search the support_rag policies, answer from the passages",
    "rag",
    (
        _v("Search the policies: how much does express shipping cost?", "12"),
        _v("Search the policies: how many years are gift cards valid?", "3"),
        _v("Search the policies: what is the largest gift card amount in euros?", "500"),
        _v("Search the policies: within how many days of delivery can I return an item for a refund?", "30"),
        _v("Search the policies: for how many days can defective items be exchanged for store credit?", "90"),
        _v("Search the policies: how many days does standard shipping take?", "3", "5"),
        _v("Search the policies: how many business days until a refund reaches my payment method?", "5"),
        _v("Search the policies: by what time must I order for same-day shipping?", "2 pm"),
        _h("Search the policies: how many days does express shipping take?", "1 to 2"),
        _h("Search the policies: can gift cards be exchanged for cash?", "cannot"),
        _h("Search the policies: who pays the customs fees for orders to Norway?", "customer"),
        _h("Search the policies: what is the smallest gift card amount in euros?", "10"),
    ),
)


def rag_task() -> tuple[Task, Callable[[], list[Tool]]] | None:
    """The task and a factory for its tools, or None when the retrieval example is not installed."""
    if not DOCS.is_dir() or importlib.util.find_spec("tether.rag") is None:
        return None
    try:
        from tether.rag._index import Index
        from tether.rag._tool import search_tool
    except ImportError:
        return None

    def tools() -> list[Tool]:
        folder = tempfile.mkdtemp(prefix="tether-bench-rag-")
        atexit.register(shutil.rmtree, folder, True)
        index = Index(folder, retriever="bm25")
        index.ingest(DOCS)
        return [search_tool(index, default_k=3)]

    return SUPPORT_RAG, tools
