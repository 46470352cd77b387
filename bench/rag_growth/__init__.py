"""How an index grows. `python -m bench.rag_growth`: lexical ingest by files; `.dense`: a `best` index
at 1k-100k passages, SQLite and PostgreSQL side by side; `.ann_choice`: which HNSW library;
`.pg_lexical`: PostgreSQL's BM25 against the SQLite index's ranking. Figures in results.json."""
