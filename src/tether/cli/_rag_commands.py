"""Retrieval commands: `tether ingest`, `tether search`, `tether ask`, `tether eval-retrieval`.

Answers and results go to stdout; progress and errors to stderr, except that with `--json` an
error is one JSON object on stdout (`{"error": ..., "exit_code": ...}`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import signal
import sqlite3
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from tether._errors import TetherError
from tether._terminal import clean

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_STOPPED = 0, 1, 2, 3
EXIT_TERMINATED = 128 + signal.SIGTERM  # what a shell reports for a process ended by SIGTERM
WRAP = 88  # error lines are wrapped to this width

IndexOption = Annotated[str, typer.Option("--index", "-i", help="Index name (under $TETHER_HOME/indexes or "
                                          "~/.tether/indexes), a directory path, or postgresql://user@host/db#name "
                                          "(an index in PostgreSQL).")]
RerankOption = Annotated[str | None, typer.Option(
    "--rerank", help="Rerank the top 20: a cross-encoder ONNX file or folder, or `llm` (the configured model as "
    "a judge; counts against --max-tokens). Off by default.")]


class CommandError(TetherError):
    """A failure the user can act on: printed as one wrapped message (or JSON) with an exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def format_error(message: str, width: int = WRAP) -> str:
    """`tether: message`, wrapped into lines of at most `width` characters (continuations indented)."""
    return "\n".join(textwrap.wrap(f"tether: {clean(message)}", width, subsequent_indent="  ", break_on_hyphens=False,
                                   break_long_words=False)) or "tether:"


def _err(message: str) -> None:
    print(format_error(message), file=sys.stderr)


def _exit_codes(cmd: Callable[..., int]) -> Callable[..., int]:
    """One mapping of failures to exit codes for every retrieval command: a missing extra names the
    install command; bad input (missing files, invalid values) is a usage error; a failing embedder or
    model is an error. With `as_json=True` the error is printed as JSON on stdout. Anything else is a
    bug and keeps its traceback."""

    signature = inspect.signature(cmd)

    @functools.wraps(cmd)
    def run(*args: Any, **kwargs: Any) -> int:
        as_json = bool(signature.bind_partial(*args, **kwargs).arguments.get("as_json"))
        try:
            return cmd(*args, **kwargs)
        except CommandError as exc:
            message, code = str(exc), exc.code
        except ImportError as exc:
            message = str(exc) if "pip install" in str(exc) else \
                f"retrieval needs the rag extra ({exc.name or exc}): pip install 'tether[rag]'"
            code = EXIT_ERROR
        except (FileNotFoundError, ValueError) as exc:
            message, code = str(exc), EXIT_USAGE
        except RuntimeError as exc:  # EmbedderUnavailable, ModelError
            message, code = str(exc), EXIT_ERROR
        except sqlite3.DatabaseError as exc:  # a damaged or foreign index.sqlite
            message, code = f"the index database cannot be used ({exc}); rebuild it with tether ingest", EXIT_ERROR
        except Exception as exc:
            if not type(exc).__module__.startswith("psycopg"):
                raise
            message, code = f"PostgreSQL: {' '.join(str(exc).split())}", EXIT_ERROR  # e.g. the server is down
        if as_json:
            print(json.dumps({"error": message, "exit_code": code}))
        else:
            _err(message)
        return code

    return run


class EmbedProgress:
    """progress(done, total) for embedding: a bar with an ETA on a terminal, else a line about every
    10% (with the ETA) on stderr."""

    def __init__(self, label: str = "embedding") -> None:
        self.label = label
        self._bar: Any = None
        self._task: Any = None
        self._start = 0.0
        self._next = 0.0

    def __call__(self, done: int, total: int) -> None:
        if total <= 0:
            return
        if done == 0:
            self._start, self._next = time.monotonic(), 0.1
            if sys.stderr.isatty():
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TextColumn,
                    TimeRemainingColumn,
                )

                self._bar = Progress(TextColumn(self.label), BarColumn(), MofNCompleteColumn(), TextColumn("ETA"),
                                     TimeRemainingColumn(), console=Console(stderr=True), transient=True)
                self._bar.start()
                self._task = self._bar.add_task(self.label, total=total)
            else:
                print(f"tether: {self.label} {total} passages", file=sys.stderr)
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=done)
            if done >= total:
                self._bar.stop()
                self._bar = None
            return
        if done / total >= self._next or done >= total:
            elapsed = time.monotonic() - self._start
            eta = elapsed / done * (total - done)
            print(f"tether: {self.label} {done}/{total} ({done * 100 // total}%), ETA {_duration(eta)}",
                  file=sys.stderr)
            self._next = done / total + 0.1


def _duration(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _open_existing(index: str):
    from tether.rag._index import Index, index_path, is_postgres_url

    if not Index.exists(index):
        where = index.split("@")[-1] if is_postgres_url(index) else index_path(index)
        raise CommandError(f"no index at {where}; create it with: tether ingest PATH --index {index}")
    return Index.open(index, progress=EmbedProgress(), notify=_err)


class Terminated(BaseException):
    """SIGTERM arrived: raised where the program is, so `with` blocks clean up (not an Exception,
    which a per-file `except Exception` would swallow)."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM raises Terminated for the block (in the main thread; elsewhere it is left alone)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@_exit_codes
def ingest_cmd(path: Path, index: str, retriever: str | None, chunk_tokens: int, overlap: int) -> int:
    from tether.rag._index import Index

    if not path.exists():
        raise CommandError(f"{path}: no such file or folder")
    new = not Index.exists(index)
    try:
        with _sigterm_raises():
            return _ingest(path, index, retriever, chunk_tokens, overlap, new)
    except Terminated:
        kept = "no index was created" if new and not Index.exists(index) else \
            "the index keeps what it had committed before"
        raise CommandError(f"ingest stopped by SIGTERM: {kept}; run it again to finish", EXIT_TERMINATED) from None


def _ingest(path: Path, index: str, retriever: str | None, chunk_tokens: int, overlap: int, new: bool) -> int:
    from tether.rag._index import DENSE_RETRIEVERS, Index
    from tether.rag._loaders import SUPPORTED

    # an error inside the block discards the index object: a new index is removed, settings are kept
    with Index.open(index, retriever=retriever, chunk_tokens=chunk_tokens, overlap=overlap,
                    progress=EmbedProgress(), notify=_err) as idx:
        if idx.retriever_name in DENSE_RETRIEVERS:  # first line: which graph embeds here, and why
            from tether.rag._encoder_path import describe

            _err(describe(getattr(idx.embedder, "path", None)))
            if (where := getattr(idx, "dense_path", None)) is not None:  # PostgreSQL: pgvector or rows
                _err(where)
        report = idx.ingest(path)
        if not report.files:
            found = f"{path}: no files to ingest (supported: {', '.join(sorted(SUPPORTED))})"
            if new:
                raise CommandError(found + "; no index was created")
            _err(found)
        elif new and not report.added:
            raise CommandError(f"{path}: none of its {report.files} files could be read; no index was created "
                               f"({report.skipped[0] if report.skipped else 'no text'})")
        total = len(idx)
        where = idx.location
    for line in report.skipped:
        _err(f"skipped {line}")
    print(f"{len(report.added)} added, {len(report.updated)} updated, {len(report.deleted)} deleted, "
          f"{len(report.unchanged)} unchanged; +{report.chunks_added} -{report.chunks_removed} chunks; "
          f"{total} chunks in {where}")
    return EXIT_OK


def _shown_source(source: str) -> str:
    """A source path relative to the working directory when it lies below it."""
    try:
        return Path(source).relative_to(Path.cwd()).as_posix()
    except ValueError:
        return source


def _snippet(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat[:limit].rsplit(" ", 1)[0]
    return (cut or flat[:limit]) + "…"


def _reranker(spec: str | None, model_spec: str | None, max_tokens: int | None):
    """None, a cross-encoder from a path, or the configured model as a judge."""
    if not spec:
        return None
    from tether.rag._rerank import CrossEncoderReranker, LLMJudgeReranker

    if spec == "llm":
        from tether._limits import Budget, Limits, MonotonicClock

        model = _resolve(model_spec)
        # One judge call per passage of the top 20; --max-tokens caps what they may spend together.
        limits = Limits(max_steps=None, max_tokens=max_tokens, final_answer=False)
        return LLMJudgeReranker(model, budget=Budget(limits, MonotonicClock()))
    return CrossEncoderReranker(spec)


def _resolve(model_spec: str | None, brief_if_tiny: bool = False):
    """The model the spec (or the environment) names; its notices on stderr (with `brief_if_tiny`,
    only the first for the embedded model: its paragraph on agent work does not apply)."""
    from tether.models._resolve import resolve_model

    said: list[str] = []
    try:
        model = resolve_model(model_spec, announce=lambda m: said.append(m.removeprefix("tether: ")))
    except Exception as exc:  # configuration errors: name them plainly
        raise CommandError(f"cannot set up the model: {exc}") from exc
    for line in said[:1] if brief_if_tiny and getattr(model, "tiny", False) else said:
        _err(line)
    return model


def _require_passages(idx: Any, index: str) -> None:
    """CommandError (exit 1) for an index with no passages: an answer from it would say nothing."""
    if len(idx):
        return
    why = ("an ingest into it was stopped; run it again to finish" if idx.resumable else
           f"no ingest into it stored any (one may have been stopped), or all were removed; add files with: "
           f"tether ingest PATH --index {index}")
    raise CommandError(f"the index {index} has no passages: {why}", EXIT_ERROR)


@_exit_codes
def search_cmd(query: str, index: str, k: int, as_json: bool, rerank: str | None = None,
               model_spec: str | None = None, max_tokens: int | None = None) -> int:
    if not query.strip():
        raise CommandError("the query is empty")
    reranker = _reranker(rerank, model_spec, max_tokens)
    with _open_existing(index) as idx:
        if reranker is not None:
            from tether.rag._rerank import RerankedSearch

            hits = RerankedSearch(idx, reranker).search(query, k)
        else:
            hits = idx.search(query, k)
        retriever = idx.answered_by or idx.retriever_name
        pending = idx.vectors_pending
        _require_passages(idx, index)
    if pending:
        _err(pending)
    if as_json:
        print(json.dumps({"query": query, "index": index, "retriever": retriever, "note": pending, "hits": [
            {"rank": i, "id": h.id, "source": h.source, "heading": h.heading, "score": round(h.score, 6),
             "snippet": _snippet(h.text), "text": h.text} for i, h in enumerate(hits, start=1)]}))
        return EXIT_OK
    if not hits:
        print("no passages matched")
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(show_lines=False, box=None, pad_edge=False, caption=f"ranked by {retriever}",
                  caption_justify="left")
    table.add_column("#", justify="right")
    table.add_column("score", justify="right")
    table.add_column("source", overflow="fold")
    table.add_column("heading", overflow="fold")
    table.add_column("snippet", overflow="fold", ratio=1)
    for i, h in enumerate(hits, start=1):  # documents' text as Text: no rich markup, no terminal sequences
        table.add_row(str(i), f"{h.score:.3f}", Text(clean(_shown_source(h.source))), Text(clean(h.heading or "-")),
                      Text(clean(_snippet(h.text, 120))))
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=140)
    console.print(table)
    return EXIT_OK


@_exit_codes
def ask_cmd(question: str, index: str, pipeline: bool, model_spec: str | None, k: int, as_json: bool,
            rerank: str | None = None, max_tokens: int | None = None, extract: bool = False) -> int:
    from tether.context import ContextOverflow
    from tether.models._base import ModelError
    from tether.rag._answer import agentic
    from tether.rag._answer import pipeline as run_pipeline

    if not question.strip():
        raise CommandError("the question is empty")
    with _open_existing(index) as idx:
        _require_passages(idx, index)
        model = None if extract else _resolve(model_spec, brief_if_tiny=True)
        searchable: Any = idx
        reranker = _reranker(rerank, model_spec, max_tokens) if rerank else None
        if reranker is not None:
            from tether.rag._rerank import RerankedSearch

            searchable = RerankedSearch(idx, reranker)
        if model is None or getattr(model, "tiny", False):  # the embedded model says so itself (LocalModel.tiny)
            return _answer_extractively(question, searchable, k, as_json, told=not extract)
        error: str | None = None
        if pipeline:
            try:
                out = run_pipeline(question, searchable, model, k=k)
                answer, status, hits = out.answer, "completed", out.hits
            except (ContextOverflow, ModelError) as exc:  # over the window: a stop, as in the agentic mode
                if isinstance(exc, ModelError) and "context" not in str(exc).lower():
                    raise
                answer, status, hits, error = "", "error", [], f"{type(exc).__name__}: {exc}"
        else:
            result = agentic(question, searchable, model, k=k)
            answer, status, hits, error = result.answer, result.stop_reason.value, [], result.error
    if error:
        error = _overflow_hint(error, k, pipeline)
    if status != "completed":  # every stop says why, even with --json (on stdout there)
        why = f"stopped: {status.replace('_', ' ')}" + (f": {error}" if error else "")
        if not as_json:
            _err(why + ("" if answer.strip() else " (no answer)"))
    if as_json:
        print(json.dumps({"answer": answer, "stop_reason": status, **({"error": error} if error else {}),
                          "passages": [{"id": h.id, "source": h.source, "score": h.score} for h in hits]}))
    elif answer.strip():
        print(clean(answer))
    return EXIT_OK if status == "completed" else EXIT_STOPPED


_OVERFLOW = ("context", "too many tokens", "prompt is too long")
_LIBRARY_ADVICE = "raise Limits.max_input_tokens or cap tool results lower"


def _overflow_hint(error: str, k: int, pipeline: bool) -> str:
    """An over-the-context-window error as a CLI user can act on it: the library's advice (a
    `Limits` field the CLI cannot set) replaced by the options that change what is sent."""
    if not any(w in error.lower() for w in _OVERFLOW):
        return error
    hint = f"ask with fewer passages per search (--k, now {k})" + ("" if pipeline else " or with --pipeline") + \
        ", or with a --model whose context window is larger"
    if _LIBRARY_ADVICE in error:
        return error.replace(_LIBRARY_ADVICE, hint)
    return f"{error.rstrip('. ')}; {hint}"


def _answer_extractively(question: str, searchable: Any, k: int, as_json: bool, told: bool) -> int:
    """The sentences of the top passages that best answer, quoted with their sources; no model call."""
    from tether.rag._extract import extract_answer

    if told and not as_json:
        _err("the embedded model cannot write answers from passages: quoting the sentences that answer "
             "(--model for a capable one)")
    answer = extract_answer(question, searchable.search(question, k))
    if as_json:
        print(json.dumps({"answer": answer.text(), "stop_reason": "completed", "found": answer.found, "quotes": [
            {"text": q.text, "passage": q.passage, "source": answer.hits[q.passage - 1].source, "score": q.score}
            for q in answer.quotes], "passages": [{"id": h.id, "source": h.source, "score": h.score}
                                                  for h in answer.hits]}))
    else:
        print(clean(answer.text(_shown_source)))
    return EXIT_OK


@_exit_codes
def eval_cmd(corpus: Path, queries: Path, qrels: Path, retriever: str, as_json: bool,
             index: str | None = None) -> int:
    from tether.rag._evaluate import (
        RETRIEVERS,
        evaluate,
        evaluate_index,
        load_collection,
        make_retriever,
        unjudged_ids,
    )

    if retriever not in RETRIEVERS:
        raise CommandError(f"unknown retriever {retriever!r}; use one of: {', '.join(RETRIEVERS)}")
    for p in (corpus, queries, qrels):
        if not p.is_file():
            raise CommandError(f"{p}: no such file")
    col = load_collection(corpus, queries, qrels)
    unknown_docs, unknown_queries = unjudged_ids(col)
    judged_docs = {d for judged in col.qrels.values() for d in judged}
    if judged_docs and unknown_docs == judged_docs:
        raise CommandError(f"{qrels}: none of its {len(judged_docs)} document ids is in {corpus} "
                           f"(e.g. {min(unknown_docs)}); check that the files belong together")
    if not any(q in col.queries for q in col.qrels):
        raise CommandError(f"{qrels}: none of its {len(col.qrels)} query ids is in {queries} "
                           f"(e.g. {min(col.qrels)}); check that the files belong together")
    if unknown_docs:
        _err(f"warning: {qrels} names {len(unknown_docs)} document ids not in {corpus} (e.g. {min(unknown_docs)}); "
             "they count as relevant documents never retrieved")
    if unknown_queries:
        _err(f"warning: {qrels} judges {len(unknown_queries)} queries not in {queries} (e.g. {min(unknown_queries)}); "
             "they are left out")
    if index:
        from tether.rag._index import Index

        with Index.open(index, retriever=retriever, progress=EmbedProgress(), notify=_err) as idx:
            result = evaluate_index(idx, col)
    else:
        from tether.rag._dense import DenseRetriever
        from tether.rag._index import retriever_parts

        made = make_retriever(retriever)
        for part in retriever_parts(made):
            if isinstance(part, DenseRetriever):
                part.progress = EmbedProgress()
        result = evaluate(made, col)
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
        """Add, update or delete the passages of PATH in an index (only changed passages are embedded)."""
        raise typer.Exit(ingest_cmd(path, index, retriever, chunk_tokens, overlap))

    @app.command("search")
    def search(
        query: Annotated[str, typer.Argument(help="What to look for.")],
        index: IndexOption = "default",
        k: Annotated[int, typer.Option("--k", "-k", help="Passages to show.", min=1, max=100)] = 10,
        as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
        rerank: RerankOption = None,
        model: Annotated[str | None, typer.Option("--model", "-m", help="Model for --rerank llm.")] = None,
        max_tokens: Annotated[int | None, typer.Option(help="Token budget for --rerank llm.", min=1)] = None,
    ) -> None:
        """Show the passages an index ranks best for QUERY: source, heading, score, snippet (no model needed)."""
        raise typer.Exit(search_cmd(query, index, k, as_json, rerank, model, max_tokens))

    @app.command("ask")
    def ask(
        question: Annotated[str, typer.Argument(help="The question.")],
        index: IndexOption = "default",
        pipeline: Annotated[bool, typer.Option("--pipeline", help="Retrieve, then one tool-free model call "
                                               "(default: the model calls the search tool).")] = False,
        model: Annotated[str | None, typer.Option("--model", "-m", help="Model spec (see `tether models`).")] = None,
        k: Annotated[int, typer.Option("--k", "-k", help="Passages per search.", min=1, max=20)] = 5,
        as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
        rerank: RerankOption = None,
        max_tokens: Annotated[int | None, typer.Option(help="Token budget for --rerank llm.", min=1)] = None,
        extract: Annotated[bool, typer.Option("--extract", help="Quote the sentences of the passages that best "
                                              "answer, with no model call (what the embedded model does).")] = False,
    ) -> None:
        """Answer a question from an index, citing passages like [2]. With the embedded model (or --extract):
        the sentences that best answer, quoted with their sources, or "not found in the index"."""
        raise typer.Exit(ask_cmd(question, index, pipeline, model, k, as_json, rerank, max_tokens, extract))

    @app.command("eval-retrieval")
    def eval_retrieval(
        corpus: Annotated[Path, typer.Option(help="corpus.jsonl (id, title, text).")],
        queries: Annotated[Path, typer.Option(help="queries.jsonl (id, text).")],
        qrels: Annotated[Path, typer.Option(help="qrels TSV: query-id, doc-id, relevance.")],
        retriever: Annotated[str, typer.Option(help="tfidf, bm25, dense, hybrid or best.")] = "best",
        as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
        index: Annotated[str | None, typer.Option("--index", "-i", help="Keep the corpus in this index (one "
                                                  "source per document) and reuse its embeddings on reruns.")] = None,
    ) -> None:
        """Report nDCG@10, Recall@10, Recall@100, MAP, index time and queries/s on a BEIR-style collection."""
        raise typer.Exit(eval_cmd(corpus, queries, qrels, retriever, as_json, index))
