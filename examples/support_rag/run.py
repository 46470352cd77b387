"""Support-policy assistant: index the Markdown policies in docs/ and answer from them.

    python examples/support_rag/run.py                    # the two demo questions, pipeline mode
    python examples/support_rag/run.py "Do you ship to Norway?" --agentic
    TETHER_MODEL=openai:gpt-4o-mini python examples/support_rag/run.py

Runs offline: the index lives in a temporary folder (or --index DIR), retrieval needs no network,
and the model is whatever `resolve_model` picks (TETHER_MODEL, an OpenAI-compatible endpoint
from the environment, else the embedded local model).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tether.models import resolve_model
from tether.rag import Index, agentic, format_passages, pipeline

DOCS = Path(__file__).with_name("docs")
QUESTIONS = ["Can I get a refund after 30 days?", "What is the warranty on laptops?"]


def build_index(directory: str | Path, retriever: str = "best", embedder=None) -> Index:
    """An index of the policy documents (re-ingest only reads files that changed)."""
    index = Index(directory, retriever=retriever, embedder=embedder)
    index.ingest(DOCS)
    return index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("questions", nargs="*", default=QUESTIONS)
    parser.add_argument("--index", help="index directory (default: a temporary one)")
    parser.add_argument("--agentic", action="store_true", help="let the model call the search tool")
    parser.add_argument("--model", help="model spec, as for `tether --model`")
    args = parser.parse_args(argv)
    model = resolve_model(args.model, announce=lambda m: print(m, file=sys.stderr))
    with tempfile.TemporaryDirectory() as tmp:
        index = build_index(args.index or tmp)
        for q in args.questions:
            print(f"Q: {q}")
            if args.agentic:
                print(f"A: {agentic(q, index, model).answer}\n")
            else:
                out = pipeline(q, index, model, k=3)
                print(format_passages(out.hits, passage_chars=160))
                print(f"A: {out.answer}\n")
        index.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
