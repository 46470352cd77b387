"""The settings of `best`, chosen by one procedure across the development collections.

`python -m bench.retrieval` scores every point of its grid (BM25 k1/b, RM3, dense windows,
Rocchio, normalisation, fusion, weight, RRF k, neighbours, gain) on every development collection
(CISI, CACM, MED) and picks the point with the best mean rank over the collections; the figures
for a collection left out of that choice are in its results.json (`leave_one_collection_out`).
The values below are that pick; a test checks they match the bench's results.json. `peak` (a
per-query fusion weight) was tuned afterwards by `python -m bench.rag_encoder.tune` on dev data only
(even queries of the three plus a venv-docstrings collection): it lost on the docstrings, so it is off.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tether.rag._dense import Rocchio
from tether.rag._lexical import RM3


@dataclass(frozen=True, slots=True)
class BestSettings:
    k1: float = 1.5
    b: float = 0.75
    rm3: RM3 | None = None
    window: int = 126  # dense MaxP windows in word pieces (0 = one vector per passage)
    rocchio: Rocchio | None = None
    norm: str = "z"  # z | minmax
    fusion: str = "sum"  # sum (weighted) | rrf
    weight: float = 0.5  # lexical share of a weighted sum
    rrf_k: int = 60
    neighbours: int = 10
    gain: float = 1.0
    peak: float = 0.0  # per-query weight: power of each side's top normalised score (0 = fixed weight)

    def as_dict(self) -> dict:
        return asdict(self)


# The procedure's pick over the 8,640-point grid (bench/retrieval/results.json, `best_settings`).
BEST = BestSettings(k1=1.2, b=0.4, rm3=RM3(docs=10, terms=20, original=0.7, max_df=0.1), window=126,
                    rocchio=None, norm="z", fusion="sum", weight=0.3, rrf_k=60, neighbours=10, gain=1.0, peak=0.0)


def best_retriever(settings: BestSettings = BEST, embedder=None, *, dense=None, min_store: int = 100):
    """The `best` retriever for `settings`: BM25 (k1, b, RM3) and dense (windows, Rocchio) fused.

    `dense` may be a ready DenseRetriever (e.g. with stored vectors); its feedback is set here."""
    from tether.rag._dense import DenseRetriever
    from tether.rag._fusion import FusionRetriever
    from tether.rag._lexical import BM25Retriever

    if dense is None:
        dense = DenseRetriever(embedder, window=settings.window, stride=max(settings.window // 2, 1))
    dense.rocchio = settings.rocchio
    return FusionRetriever(
        BM25Retriever(settings.k1, settings.b, rm3=settings.rm3), dense, weight=settings.weight,
        neighbours=settings.neighbours, gain=settings.gain, norm=settings.norm, fusion=settings.fusion,
        rrf_k=settings.rrf_k, min_store=min_store, peak=settings.peak)
