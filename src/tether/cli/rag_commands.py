"""Retrieval commands: `tether ingest`, `tether ask`, `tether eval-retrieval`.

Answers and results go to stdout; progress and errors to stderr.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_STOPPED = 0, 1, 2, 3

IndexOption = Annotated[str, typer.Option("--index", "-i", help="Index name (under $TETHER_HOME/indexes or "
                                          "~/.tether/indexes) or a directory path.")]


def _err(message: str) -> None:
    print(f"tether: {message}", file=sys.stderr)


def _exit_codes(cmd: Callable[..., int]) -> Callable[..., int]:
    """One mapping of failures to exit codes for every retrieval command: a missing extra names the
    install command; bad input (missing files, invalid values) is a usage error; a failing embedder or
    model is an error. Anything else is a bug and keeps its traceback."""

    @functools.wraps(cmd)
    def run(*args: Any, **kwargs: Any) -> int:
        try:
            return cmd(*args, **kwargs)
        except ImportError as exc:
            _err(f"retrieval needs the rag extra ({exc.name or exc}): pip install 'tether[rag]'")
            return EXIT_ERROR
        except (FileNotFoundError, ValueError) as exc:
            _err(str(exc))
            return EXIT_USAGE
        except RuntimeError as exc:  # EmbedderUnavailable, ModelError
            _err(str(exc))
            return EXIT_ERROR

    return run


@_exit_codes
def ingest_cmd(path: Path, index: str, retriever: str | None, chunk_tokens: int, overlap: int) -> int:
    from tether.rag.index import Index

    with Index.open(index, retriever=retriever, chunk_tokens=chunk_tokens, overlap=overlap) as idx:
        report = idx.ingest(path)
        total = len(idx)
        where = idx.path
    for line in report.skipped:
        _err(f"skipped {line}")
    print(f"{len(report.added)} added, {len(report.updated)} updated, {len(report.deleted)} deleted, "
          f"{len(report.unchanged)} unchanged; +{report.chunks_added} -{report.chunks_removed} chunks; "
          f"{total} chunks in {where}")
    return EXIT_OK


@_exit_codes
def ask_cmd(question: str, index: str, pipeline: bool, model_spec: str | None, k: int, as_json: bool) -> int:
    from tether.rag.answer import agentic
    from tether.rag.answer import pipeline as run_pipeline
    from tether.rag.index import Index, index_path

    if not question.strip():
        _err("the question is empty")
        return EXIT_USAGE
    path = index_path(index)
    if not (path / "index.sqlite").exists():
        _err(f"no index at {path}; create it with: tether ingest PATH --index {index}")
        return EXIT_USAGE
    from tether.models.resolve import resolve_model

    try:
        model = resolve_model(model_spec, announce=lambda m: print(m, file=sys.stderr))
    except Exception as exc:  # configuration errors: name them plainly
        _err(f"cannot set up the model: {exc}")
        return EXIT_USAGE
    with Index.open(path) as idx:
        if pipeline:
            out = run_pipeline(question, idx, model, k=k)
            answer, status, hits = out.answer, "completed", out.hits
        else:
            result = agentic(question, idx, model, k=k)
            answer, status, hits = result.answer, result.stop_reason.value, []
    if as_json:
        print(json.dumps({"answer": answer, "stop_reason": status,
                          "passages": [{"id": h.id, "source": h.source, "score": h.score} for h in hits]}))
    else:
        print(answer)
    return EXIT_OK if status == "completed" else EXIT_STOPPED


@_exit_codes
def eval_cmd(corpus: Path, queries: Path, qrels: Path, retriever: str, as_json: bool) -> int:
    from tether.rag.evaluate import RETRIEVERS, evaluate, load_collection, make_retriever

    if retriever not in RETRIEVERS:
        _err(f"unknown retriever {retriever!r}; use one of: {', '.join(RETRIEVERS)}")
        return EXIT_USAGE
    for p in (corpus, queries, qrels):
        if not p.is_file():
            _err(f"{p}: no such file")
            return EXIT_USAGE
    col = load_collection(corpus, queries, qrels)
    result = evaluate(make_retriever(retriever), col)
    keys = ("ndcg@10", "recall@10", "recall@100", "map", "index_seconds", "queries_per_second")
    if as_json:
        print(json.dumps({k: round(result[k], 4) for k in keys}))
    else:
        print(f"retriever {retriever}: {len(col.doc_ids)} documents, "
              f"{sum(1 for q in col.queries if q in col.qrels)} judged queries")
        for k in keys:
            print(f"{k:>20}  {result[k]:.4f}")
    return EXIT_OK


def register(app: typer.Typer) -> None:
    """Add the retrieval commands to the `tether` app."""

    @app.command("ingest")
    def ingest(
        path: Annotated[Path, typer.Argument(help="A file or folder (Markdown, text, HTML, PDF).")],
        index: IndexOption = "default",
        retriever: Annotated[str | None, typer.Option(
            help="tfidf, bm25, dense, hybrid or best (kept with the index; default best).")] = None,
        chunk_tokens: Annotated[int, typer.Option(help="Words per chunk (new indexes).", min=16)] = 200,
        overlap: Annotated[int, typer.Option(help="Words shared by consecutive chunks.", min=0)] = 40,
    ) -> None:
        """Add, update or delete the passages of PATH in an index (only changed files are re-read)."""
        raise typer.Exit(ingest_cmd(path, index, retriever, chunk_tokens, overlap))

    @app.command("ask")
    def ask(
        question: Annotated[str, typer.Argument(help="The question.")],
        index: IndexOption = "default",
        pipeline: Annotated[bool, typer.Option("--pipeline", help="Retrieve, then one tool-free model call "
                                               "(default: the model calls the search tool).")] = False,
        model: Annotated[str | None, typer.Option("--model", "-m", help="Model spec (see `tether models`).")] = None,
        k: Annotated[int, typer.Option("--k", "-k", help="Passages per search.", min=1, max=20)] = 5,
        as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    ) -> None:
        """Answer a question from an index, citing passages like [2]."""
        raise typer.Exit(ask_cmd(question, index, pipeline, model, k, as_json))

    @app.command("eval-retrieval")
    def eval_retrieval(
        corpus: Annotated[Path, typer.Option(help="corpus.jsonl (id, title, text).")],
        queries: Annotated[Path, typer.Option(help="queries.jsonl (id, text).")],
        qrels: Annotated[Path, typer.Option(help="qrels TSV: query-id, doc-id, relevance.")],
        retriever: Annotated[str, typer.Option(help="tfidf, bm25, dense, hybrid or best.")] = "best",
        as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    ) -> None:
        """Report nDCG@10, Recall@10, Recall@100, MAP, index time and queries/s on a BEIR-style collection."""
        raise typer.Exit(eval_cmd(corpus, queries, qrels, retriever, as_json))
