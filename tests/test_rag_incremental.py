"""An index changed file by file ranks as one built at once from the final files; a change costs
the change (stable slots, BM25 segments, vectors appended in place), and a quarter of dead slots
compacts the store without changing a ranking."""

from __future__ import annotations

import hashlib
import random
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("hnswlib")
pytest.importorskip("bm25s")
pytest.importorskip("Stemmer")

from tether.rag._index import Index
from tether.rag._neighbours import Neighbours

WORDS = [f"{a}{b}" for a in ("ka", "lo", "mi", "su", "te", "va", "ro", "ne") for b in ("ban", "cor", "dil", "fen", "gur")]
QUERIES = ["kaban locor", "midil sufen tegur", "vaban", "robcor nefen kadil", "sugur mifen lodil"]


class HashEmbedder:
    """Each text its own seeded random unit vector: no two passages tie, so the neighbour graph of
    a changed store and of one built at once are the same, not the same up to ties."""

    name = "random-32"
    dim = 32

    def embed(self, texts):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            out[i] = np.random.default_rng(int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little")).standard_normal(self.dim)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30)))


def ranked(idx: Index) -> dict[str, list[tuple[str, float]]]:
    return {q: [(h.id, h.score) for h in idx.search(q, 10)] for q in QUERIES}


def assert_same(got: dict[str, list[tuple[str, float]]], want: dict[str, list[tuple[str, float]]]) -> None:
    """The same scores, and the same passages with each score (passages that tie may come in another
    order, and the last ones of a tie may be others: positions break ties)."""
    for q in QUERIES:
        np.testing.assert_allclose([s for _, s in got[q]], [s for _, s in want[q]], atol=1e-4, err_msg=q)
        last = want[q][-1][1] if want[q] else 0.0
        assert sorted((round(s, 3), i) for i, s in got[q] if s > last + 1e-4) == sorted(
            (round(s, 3), i) for i, s in want[q] if s > last + 1e-4), q


def fresh(path: Path, retriever: str, files: dict[str, str]) -> dict[str, list[tuple[str, float]]]:
    with Index(path, retriever=retriever, embedder=HashEmbedder()) as idx:
        idx.add_texts(sorted(files.items()), markdown=False)
        return ranked(idx)


def meta(path: Path) -> dict[str, str]:
    with sqlite3.connect(path / "index.sqlite") as db:
        return dict(db.execute("SELECT key, value FROM meta").fetchall())


@pytest.mark.parametrize("retriever", ["bm25", "best"])
def test_an_index_changed_file_by_file_ranks_as_one_built_from_the_final_files(
        tmp_path: Path, retriever: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(5)
    files = {f"f{i:03d}": text(rng) for i in range(160)}
    builds: list[int] = []
    original = Neighbours.build.__func__  # type: ignore[attr-defined]

    def counted(cls: type[Neighbours], vectors: np.ndarray, *args: Any) -> Neighbours:
        builds.append(len(vectors))
        return original(cls, vectors, *args)

    monkeypatch.setattr(Neighbours, "build", classmethod(counted))
    grown = tmp_path / "grown"
    with Index(grown, retriever=retriever, embedder=HashEmbedder()) as idx:
        idx.add_texts(sorted(files.items()), markdown=False)
        ranked(idx)  # the first search stores the lexical and neighbour state
        seen: list[tuple[dict[str, list[tuple[str, float]]], dict[str, str]]] = []
        for step in range(12):  # one file rewritten, one removed, one added: no compaction yet
            before = meta(grown)
            changed, gone = rng.sample(sorted(files), 2)
            files[changed] = text(rng)
            del files[gone]
            files[f"new{step}"] = text(rng)
            idx.add_text(changed, files[changed], markdown=False)
            idx.remove(gone)
            idx.add_text(f"new{step}", files[f"new{step}"], markdown=False)
            after = meta(grown)
            assert after.get("compacted") is None and int(after["slots"]) == int(before["slots"]) + 2
            assert after["lexical-bm25.npz"].startswith(after["generation"] + ":")  # carried, not refitted
            if step % 4 == 3:
                seen.append((ranked(idx), dict(files)))
        assert builds == ([] if retriever == "bm25" else [160])  # the neighbour state was carried, never rebuilt
        for i, (got, then) in enumerate(seen):
            assert_same(got, fresh(tmp_path / f"fresh{i}", retriever, then))
        for gone in rng.sample(sorted(files), 40):  # a quarter of the slots dead: compacted once
            del files[gone]
            idx.remove(gone)
        m = meta(grown)
        assert m.get("compacted") and 4 * (int(m["slots"]) - len(idx)) <= int(m["slots"]) < 160
        assert m["lexical-bm25.npz"].startswith(m["generation"] + ":")
        assert_same(ranked(idx), fresh(tmp_path / "fresh-last", retriever, files))
    with Index(grown, retriever=retriever, embedder=HashEmbedder()) as idx:  # reopened: the stored state
        assert_same(ranked(idx), fresh(tmp_path / "fresh-reopened", retriever, files))


def test_a_one_file_change_appends_to_the_vector_files_in_place(tmp_path: Path) -> None:
    rng = random.Random(2)
    with Index(tmp_path / "ix", retriever="best", embedder=HashEmbedder()) as idx:
        idx.add_texts([(f"f{i}", text(rng)) for i in range(120)], markdown=False)
        idx.search("kaban", 3)
        names = [f"{kind}.1.npy" for kind in ("vectors", "windows", "window_owner")]  # (the first epoch's)
        files = [(tmp_path / "ix" / n).stat().st_ino for n in names]
        idx.add_text("f7", text(rng), markdown=False)
        vectors = np.load(tmp_path / "ix" / names[0])
        assert vectors.shape == (121, 32)  # the old slot stays (dead) until a compaction
        assert [(tmp_path / "ix" / n).stat().st_ino for n in names] == files  # the same files, grown
        np.testing.assert_allclose(vectors[120], HashEmbedder().embed([idx.chunks()[-1].indexed_text])[0], atol=1e-6)


def test_a_search_built_before_another_process_compacted_reads_no_renumbered_slot(tmp_path: Path) -> None:
    rng = random.Random(3)
    files = {f"f{i}": text(rng) for i in range(40)}
    with Index(tmp_path / "ix", retriever="bm25") as writer:
        writer.add_texts(sorted(files.items()), markdown=False)
    with Index(tmp_path / "ix", retriever="bm25") as reader, Index(tmp_path / "ix", retriever="bm25") as writer:
        reader.search("kaban", 5)
        found = reader._retriever.search("kaban", 5)  # type: ignore[union-attr]
        for name in sorted(files)[:15]:
            writer.remove(name)
            del files[name]
        assert meta(tmp_path / "ix").get("compacted")
        assert reader._hits(found) is None  # slots renumbered since: not read as other chunks
        hits = reader.search("kaban", 5)  # built again
        assert {h.source for h in hits} <= set(files)
        assert [h.id for h in hits] == [h.id for h in writer.search("kaban", 5)]


def test_another_process_replays_the_hnsw_log_into_the_writers_graph(tmp_path: Path) -> None:
    """Above the ANN threshold a change adds to the HNSW index without writing its file; a reader
    replays the logged changes on the file and holds the graph the writer holds (compared with a
    small search beam, which any difference in the graph would show)."""
    rng = random.Random(4)
    files = {f"f{i:03d}": text(rng) for i in range(400)}
    with Index(tmp_path / "ix", retriever="best", embedder=HashEmbedder(), ann_threshold=50) as writer:
        writer.add_texts(sorted(files.items()), markdown=False)
        writer.search("kaban", 3)
        for step in range(8):
            writer.remove(sorted(files)[step])
            writer.add_texts([(f"n{step}-{j}", text(rng)) for j in range(6)], markdown=False)
        writer.search("kaban", 3)
        mine: Any = writer._retriever
        with Index(tmp_path / "ix", retriever="best", embedder=HashEmbedder(), ann_threshold=50) as reader:
            reader.search("kaban", 3)
            theirs: Any = reader._retriever
            assert len(list((tmp_path / "ix").glob("ann-*.hnsw"))) == 1
            probes = HashEmbedder().embed([f"probe {i}" for i in range(300)])
            for ann in (mine.dense.ivf, theirs.dense.ivf):
                ann.index.set_ef(10)
            a, _ = mine.dense.ivf.index.knn_query(probes, k=10)
            b, _ = theirs.dense.ivf.index.knn_query(probes, k=10)
            assert np.array_equal(a, b)
