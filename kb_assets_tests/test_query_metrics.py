"""Evaluation metrics on a hand-computed example, and the BEIR / jsonl loaders."""
from __future__ import annotations

import math

import pytest

from kb_assets.query.metrics import evaluate, load_qrels, load_queries, mrr_at_k, ndcg_at_k, recall_at_k

QRELS = {"q1": {"d1": 1, "d2": 1}, "q2": {"d3": 2, "d4": 1}, "q3": {"d7": 1}, "q4": {"d9": 0}}
RUN = {"q1": ["d5", "d1", "d6", "d2"], "q2": ["d4", "d3"], "q4": ["d9"]}


def test_hand_computed_example():
    # q1: relevant at ranks 2 and 4 -> DCG = 1/log2(3) + 1/log2(5); ideal = 1 + 1/log2(3)
    q1 = (1 / math.log2(3) + 1 / math.log2(5)) / (1 + 1 / math.log2(3))
    assert q1 == pytest.approx(0.650921, abs=1e-6)
    # q2: grade 1 at rank 1, grade 2 at rank 2 -> DCG = 1 + 2/log2(3); ideal = 2 + 1/log2(3)
    q2 = (1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3))
    assert q2 == pytest.approx(0.859719, abs=1e-6)
    assert ndcg_at_k(RUN["q1"], QRELS["q1"], 10) == pytest.approx(q1)
    assert ndcg_at_k(RUN["q2"], QRELS["q2"], 10) == pytest.approx(q2)
    assert ndcg_at_k(RUN["q1"], QRELS["q1"], 2) == pytest.approx((1 / math.log2(3)) / (1 + 1 / math.log2(3)))
    assert recall_at_k(RUN["q1"], QRELS["q1"], 1) == 0.0
    assert recall_at_k(RUN["q1"], QRELS["q1"], 2) == 0.5
    assert recall_at_k(RUN["q1"], QRELS["q1"], 5) == 1.0
    assert mrr_at_k(RUN["q1"], QRELS["q1"], 10) == 0.5
    assert mrr_at_k(RUN["q1"], QRELS["q1"], 1) == 0.0
    assert mrr_at_k(RUN["q2"], QRELS["q2"], 10) == 1.0
    m = evaluate(RUN, QRELS)
    # q4 has no relevant document: left out; q3 has one but no run entry: counts as 0
    assert m["queries"] == 3 and m["missing_in_run"] == 1
    assert m["ndcg@10"] == pytest.approx((q1 + q2 + 0) / 3)
    assert m["mrr@10"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert m["recall@1"] == pytest.approx((0 + 0.5 + 0) / 3)
    assert m["recall@5"] == pytest.approx((1 + 1 + 0) / 3)
    assert m["recall@100"] == pytest.approx(2 / 3)


def test_repeated_documents_earn_nothing_twice():
    assert ndcg_at_k(["d1", "d1"], {"d1": 1, "d2": 1}, 10) == pytest.approx(1 / (1 + 1 / math.log2(3)))


def test_loaders(tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text('{"_id": "a", "text": "first"}\n\n{"id": "b", "query": "second"}\n')
    assert load_queries(q) == {"a": "first", "b": "second"}
    r = tmp_path / "r.tsv"
    r.write_text("query-id\tcorpus-id\tscore\na\tpep-0001\t1\na\tpep-0002\t2\nb\tpep-0003\t1\n")
    assert load_qrels(r) == {"a": {"pep-0001": 1, "pep-0002": 2}, "b": {"pep-0003": 1}}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"_id": "a"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_queries(bad)
    (tmp_path / "bad.tsv").write_text("a\tb\n")
    with pytest.raises(ValueError, match="bad.tsv:1"):
        load_qrels(tmp_path / "bad.tsv")


def test_shared_eval_set_loads(shared_dir):
    queries = load_queries(shared_dir / "eval" / "peps_whatsnew" / "queries.jsonl")
    qrels = load_qrels(shared_dir / "eval" / "peps_whatsnew" / "qrels" / "test.tsv")
    assert len(queries) == 244 and sum(len(v) for v in qrels.values()) == 292
    # a perfect run scores 1.0 everywhere
    perfect = {q: sorted(rels, key=lambda d: -rels[d]) for q, rels in qrels.items()}
    m = evaluate(perfect, qrels)
    assert m["ndcg@10"] == pytest.approx(1.0) and m["recall@100"] == pytest.approx(1.0)
