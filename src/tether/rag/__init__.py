"""Retrieval as a tool: ingest files into a persistent index, search it lexically (TF-IDF, BM25),
densely (all-MiniLM-L6-v2 on onnxruntime) or both, and answer with numbered citations.

    from tether.rag import Index, search_tool
    index = Index.open("support")             # ~/.tether/indexes/support ($TETHER_HOME)
    index.ingest("docs/")                     # incremental: only changed files are re-read
    agent = Agent(model, tools=[search_tool(index)], instructions=AGENT_INSTRUCTIONS)

Needs the `rag` extra. Heavy dependencies (bm25s, onnxruntime) load on first use.
"""

from tether.rag._answer import PipelineAnswer, agentic, apipeline, pipeline
from tether.rag._base import Hit, Retriever
from tether.rag._chunking import Chunk, chunk_sections
from tether.rag._evaluate import evaluate, load_collection, make_retriever
from tether.rag._index import Index, IngestReport
from tether.rag._pg_index import PostgresIndex
from tether.rag._prompt import AGENT_INSTRUCTIONS, NO_ANSWER, build_messages, build_prompt, format_passages
from tether.rag._tool import search_tool

__all__ = [
    "AGENT_INSTRUCTIONS",
    "NO_ANSWER",
    "Chunk",
    "Hit",
    "Index",
    "IngestReport",
    "PipelineAnswer",
    "PostgresIndex",
    "Retriever",
    "agentic",
    "apipeline",
    "build_messages",
    "build_prompt",
    "chunk_sections",
    "evaluate",
    "format_passages",
    "load_collection",
    "make_retriever",
    "pipeline",
    "search_tool",
]
