"""recall() quality through the real entry points, beside a plain baseline computed in the same run.

    pip install -e '.[bench]'                    # bm25s + PyStemmer for the baseline
    python bench/quality.py                      # build (or reuse) every set's index with `kb index`, evaluate,
                                                 # print the tables and write bench/out/quality/results.json
    python bench/quality.py --sets rust_rfcs,code_history --doc   # … and rewrite docs/QUALITY.md's figures
    python bench/quality.py --build-only         # only build / refresh the cached indexes
    python bench/quality.py --variants           # also evaluate the ranking variants (VARIANTS) per set

Sets (../shared/eval, README there): rust_rfcs (45 agent questions, graded 2/1, 648 RFCs), code_history (50 bug
reports -> files of the click / httpx snapshots; the CODE section, each query within its own repository),
peps_whatsnew (244 What's-New paragraphs; a fixed PEP subset, see PEP_SUBSET), regression (the committed set
kb_assets/query/regression, section per query).

Index: each set is indexed by `kb index --config <set>/kb.yaml` in a subprocess (the Dagster job with its asset
checks, exactly what a user runs), into bench/out/quality/index/<set>-<key>/. The key hashes the corpus
tarballs, the set's source definition and the indexing code (kb_assets/{sources,chunking,embedding,pipeline,
store,defs} and the query statistics / regression check it runs): an unchanged key reuses the index. A new key
builds a new index from scratch; its chunk vectors may be seeded from the previous builds' (chunk hash ->
vector, content-addressed exactly like kb's own embedding reuse), so a re-build after a chunker or pipeline
change pays only for new chunk texts. A seed is refused only when document vectors could differ: another model
(name, dimension, digest of its files) or another document-side embedding path (DOCUMENT_EMBEDDING_CODE: the
model input text, embed_documents and what it runs; library versions); query-side code does not count.
`--no-seed` turns seeding off.

Cache: `--cache-dir DIR` or KB_QUALITY_CACHE=DIR (default bench/out/quality): indexes, seeds, unpacked corpora,
baseline vectors and results.json live there, so another checkout can reuse the built indexes.

Baseline (computed here, every run; its document embeddings cached as .npy under bench/out/quality/baseline/):
bm25s Lucene BM25 (k1 1.5, b 0.75, English stop words, Snowball English stemmer via PyStemmer); code files as
path + content with identifiers split (camelCase, snake_case, dotted) as the eval README's reference does;
all-MiniLM-L6-v2 (the packaged model kb uses) on the first 256 word pieces of each prose document, or on 40-line
windows of each code file with the best window scoring the file; RRF k = 60 of the two rankings.

kb figures: recall() in-process against the cached database, `ranked_ids=True`, the ranking of every candidate
before the section limits; relevance gate off (ranking quality) and on (what users get: its effect on
Recall@100). Metrics: kb_assets/query/metrics.py.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = Path(os.environ.get("KB_SHARED_DIR", ROOT.parent / "shared"))
EVAL = SHARED / "eval"
CORPORA = SHARED / "corpora"
# The cache (indexes, seeds, unpacked corpora, baseline vectors, results): --cache-dir or KB_QUALITY_CACHE, so
# several checkouts (a helper's worktree, the lead's merge) can share one set of built indexes.
DEFAULT_CACHE = ROOT / "bench" / "out" / "quality"
OUT = Path(os.environ.get("KB_QUALITY_CACHE") or DEFAULT_CACHE).expanduser().resolve()

# What decides an index's content: the corpus and this code. (The query engine is not in it: it only reads.)
INDEXING_CODE = ["kb_assets/sources", "kb_assets/chunking", "kb_assets/embedding", "kb_assets/pipeline",
                 "kb_assets/store", "kb_assets/defs", "kb_assets/query/regression.py",
                 "kb_assets/query/regression", "kb_assets/config.py", "kb_assets/cli.py"]
# What decides a chunk's *document vector*, given its chunk hash (heading + text, models.Chunk.chunk_hash): the
# model's weights and dimension, and the code that turns the chunk into model input and runs the model on it
# for documents. Not the query side (numpy_bert's query encoder, embed_query), not chunking or the pipeline
# (vectors are content-addressed by chunk hash): a seed taken before such a change stays valid.
DOCUMENT_EMBEDDING_CODE = [("kb_assets.models", "Chunk.embedding_text"), ("kb_assets.pipeline.embeddings", "_texts"),
                           ("kb_assets.embedding.base", "as_matrix"), ("kb_assets.embedding.local", "load_model"),
                           ("kb_assets.embedding.local", "LocalEmbedder._encode_in_length_order"),
                           ("kb_assets.embedding.local", "LocalEmbedder.embed_documents")]
DOCUMENT_EMBEDDING_PACKAGES = ["sentence-transformers", "torch", "transformers"]

OFF_TOPIC = [
    "restart celery workers nightly", "terraform remote state locking", "kubernetes horizontal pod autoscaler",
    "chocolate cake recipe", "react component lifecycle hooks", "rotate AWS IAM access keys",
    "bid pipeline kafka streaming", "jwt refresh token expiry", "nginx reverse proxy health check",
    "grafana dashboard for redis memory", "mobile app push notifications", "tax rules for invoices in Germany",
]
# Off-topic for the regression corpus itself (infrastructure ADRs + a webhook relay): the list above names
# terraform, nginx, redis … which that corpus is about, so it gets its own.
OFF_TOPIC_REGRESSION = [
    "chocolate cake recipe", "tax rules for invoices in Germany", "mobile app push notifications",
    "react component lifecycle hooks", "medieval castle architecture", "how to train a puppy",
]


def log(*a) -> None:
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# ------------------------------------------------------------------------------------------------ sets
@dataclass
class Source:
    key: str
    kind: str
    tarball: str | None          # glob under CORPORA; None: `root` given
    include: list[str]
    exclude: list[str] = field(default_factory=list)
    root: str | None = None
    auto_kind: bool = False
    only: list[str] | None = None   # unpack only these paths (relative to the source root)


@dataclass
class EvalSet:
    name: str
    sources: list[Source]
    queries: Callable[[], list[dict]]          # {"id", "query", "source"?: filter, "section": "documents"|"code"}
    qrels: Callable[[], dict[str, dict[str, int]]]   # qid -> {path (within its source): grade}
    off_topic: list[str] = field(default_factory=lambda: list(OFF_TOPIC))


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def _qrels(path: Path) -> dict[str, dict[str, int]]:
    from kb_assets.query.metrics import load_qrels
    return load_qrels(path)


def _rfc_queries() -> list[dict]:
    return [{"id": q["id"], "query": q["query"], "section": "documents"}
            for q in _jsonl(EVAL / "rust_rfcs" / "queries.jsonl")[::RFC_QUERY_EVERY]]


def _rfc_qrels() -> dict[str, dict[str, int]]:
    keep = {q["id"] for q in _rfc_queries()}
    return {q: rel for q, rel in _qrels(EVAL / "rust_rfcs" / "qrels" / "test.tsv").items() if q in keep}


def _code_queries() -> list[dict]:
    return [{"id": q["id"], "query": q["query"], "source": q["repo"], "section": "code"}
            for q in _jsonl(EVAL / "code_history" / "queries.jsonl")]


def _pep_queries() -> list[dict]:
    return [{"id": q["_id"], "query": q["text"], "section": "documents"}
            for q in _jsonl(EVAL / "peps_whatsnew" / "queries.jsonl")[::PEP_QUERY_EVERY]]


def _pep_qrels() -> dict[str, dict[str, int]]:
    keep = {q["id"] for q in _pep_queries()}
    return {q: {f"peps/{d}.rst": g for d, g in rel.items()}
            for q, rel in _qrels(EVAL / "peps_whatsnew" / "qrels" / "test.tsv").items() if q in keep}


def judged_subset(tar_glob: str, pattern: str, judged: set[str], every: int) -> list[str]:
    """Every document a query is judged against, plus every `every`-th other one (by path) as distractors."""
    tars = sorted(glob.glob(str(CORPORA / tar_glob)))
    with tarfile.open(tars[0]) as tf:
        names = sorted({m.name.split("/", 1)[1] for m in tf.getmembers() if m.isfile() and re.search(pattern, m.name)})
    others = [n for n in names if n not in judged]
    return sorted(judged & set(names)) + others[::every]


# The shared CPU embeds 1-5 chunks/s (load 10-18 from other work), so the big sets run on fixed subsets:
# Full sets by default; KB_QUALITY_SUBSET=1 restores last session's documented subsets (for a loaded machine);
# KB_QUALITY_SUBSET=rust_rfcs (or peps_whatsnew, comma-separated) the subset of those sets only.
_SUBSET_ENV = os.environ.get("KB_QUALITY_SUBSET", "")
_SUBSET_SETS = {"rust_rfcs", "peps_whatsnew"} if _SUBSET_ENV == "1" else set(filter(None, _SUBSET_ENV.split(",")))
RFC_QUERY_EVERY = 1                     # rust_rfcs: every query (45), ...
RFC_EVERY = 20 if "rust_rfcs" in _SUBSET_SETS else 1   # ... every RFC (subset: judged + every 20th other; full 648, ~17.5K chunks)
PEP_QUERY_EVERY = 4 if "peps_whatsnew" in _SUBSET_SETS else 1   # peps_whatsnew: all 244 queries (subset: every 4th, 61), ...
PEP_EVERY = 25 if "peps_whatsnew" in _SUBSET_SETS else 1        # ... every PEP (subset: judged + every 25th other; full 736, ~17.8K chunks)


def rfc_subset(every: int = RFC_EVERY) -> list[str]:
    judged = {d for rel in _rfc_qrels().values() for d in rel}
    return judged_subset("rust-rfcs-*.tar.gz", r"/text/.*\.md$", judged, every)


def pep_subset(every: int = PEP_EVERY) -> list[str]:
    """Every PEP a query is judged against, plus every `every`-th other PEP (by number) as distractors.

    The full 736-PEP index (~17.8K chunks) costs 25+ minutes of quiet CPU (an hour on the shared one); this
    subset keeps every qrel'd document and a fixed, documented share of the rest, so figures are comparable
    run to run (not with the full-corpus figures of bench/eval_peps.py: fewer distractors make it easier)."""
    judged = {d for rel in _pep_qrels().values() for d in rel}
    return judged_subset("python-peps-*.tar.gz", r"/peps/pep-\d+\.rst$", judged, every)


def _regression_queries() -> list[dict]:
    from kb_assets.query.regression import load_queries
    return [{"id": q["id"], "query": q["query"], "source": "regression", "section": q.get("section") or "documents"}
            for q in load_queries()]


def _regression_qrels() -> dict[str, dict[str, int]]:
    from kb_assets.query.regression import load_queries
    return {q["id"]: {p: 1 for p in q["expected"]} for q in load_queries()}


def make_sets() -> dict[str, EvalSet]:
    from kb_assets.query.regression import CORPUS_DIR, EXCLUDE, INCLUDE
    return {
        "rust_rfcs": EvalSet("rust_rfcs", [Source("rfcs", "adr", "rust-rfcs-*.tar.gz", ["text/**/*.md"],
                                                         only=rfc_subset())],
                             _rfc_queries, _rfc_qrels),
        "code_history": EvalSet("code_history", [
            Source("click", "code", "code-pallets+click-*.tar.gz", ["**/*.py"], []),
            Source("httpx", "code", "code-encode+httpx-*.tar.gz", ["**/*.py"], [])],
            _code_queries, lambda: _qrels(EVAL / "code_history" / "qrels" / "test.tsv")),
        "peps_whatsnew": EvalSet("peps_whatsnew", [Source("peps", "adr", "python-peps-*.tar.gz", ["peps/pep-*.rst"],
                                                          only=pep_subset())], _pep_queries, _pep_qrels),
        "regression": EvalSet("regression", [Source("regression", "code", None, list(INCLUDE), list(EXCLUDE),
                                                    root=str(CORPUS_DIR), auto_kind=True)],
                              _regression_queries, _regression_qrels, list(OFF_TOPIC_REGRESSION)),
    }

# Test files stay in the code corpora (as in a user's index): they are the distractors.


# ------------------------------------------------------------------------------------------------ index
def _hash_paths(paths: list[str]) -> str:
    h = hashlib.sha256()
    for rel in paths:
        p = ROOT / rel
        files = sorted(x for x in p.rglob("*") if x.is_file() and "__pycache__" not in x.parts) if p.is_dir() else [p]
        for f in files:
            h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _sha_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _tarball(pattern: str) -> Path:
    tars = sorted(glob.glob(str(CORPORA / pattern)))
    if not tars:
        sys.exit(f"quality: no corpus {pattern} under {CORPORA} — is ../shared beside the checkout?")
    return Path(tars[0])


def corpus_dir(es: EvalSet, s: Source) -> Path:
    tag = ("-" + hashlib.sha256("\n".join(s.only).encode()).hexdigest()[:8]) if s.only else ""
    return OUT / "corpora" / f"{es.name}-{s.key}{tag}"


def _unpack(src: Source, dest: Path) -> Path:
    """Unpack a corpus tarball (its one top folder stripped) into dest; `only` limits the files."""
    if (dest / ".complete").exists():
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    only = set(src.only) if src.only else None
    with tarfile.open(_tarball(src.tarball)) as tf:
        members = []
        for m in tf.getmembers():
            parts = m.name.split("/", 1)
            if len(parts) < 2 or not parts[1]:
                continue
            if only is not None and m.isfile() and parts[1] not in only:
                continue
            m.name = parts[1]
            members.append(m)
        tf.extractall(tmp, members=members, filter="data")
    (tmp / ".complete").write_text("ok")
    tmp.rename(dest)
    return dest


def set_key(es: EvalSet) -> str:
    h = hashlib.sha256()
    for s in es.sources:
        h.update(json.dumps({k: v for k, v in s.__dict__.items() if k != "root"}, sort_keys=True).encode())
        h.update((_sha_file(_tarball(s.tarball)) if s.tarball else _hash_paths(
            [str(Path(s.root).relative_to(ROOT))])).encode())
    h.update(_hash_paths(INDEXING_CODE).encode())
    return h.hexdigest()[:12]


def write_config(es: EvalSet, work: Path) -> Path:
    lines = ["data_dir: data", "embedder: local", "signposter: extractive", "sources:"]
    for s in es.sources:
        root = Path(s.root) if s.root else _unpack(s, corpus_dir(es, s))
        lines += [f"  - key: {s.key}", f"    kind: {s.kind}", f"    root: {json.dumps(str(root))}",
                  f"    include: {json.dumps(s.include)}", f"    exclude: {json.dumps(s.exclude)}"]
        if s.auto_kind:
            lines.append("    auto_kind: true")
    cfg = work / "kb.yaml"
    cfg.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return cfg


def _env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("KB_DATABASE_URL", None)
    env.pop("KB_CONFIG", None)
    return env


def document_vector_identity(cfg) -> dict:
    """What a stored chunk vector depends on besides its chunk hash (see DOCUMENT_EMBEDDING_CODE): the model (name,
    dimension, a digest of every file of its folder: weights, tokenizer, pooling) and the document-side code
    and library versions. A seed is used only when this is equal."""
    import inspect
    from importlib import import_module
    from importlib.metadata import PackageNotFoundError, version

    from kb_assets.embedding.local import LocalEmbedder

    emb = LocalEmbedder(cfg.local)
    weights = hashlib.sha256()
    for f in sorted(x for x in emb.path.rglob("*") if x.is_file()):
        weights.update(str(f.relative_to(emb.path)).encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                weights.update(block)
    code = hashlib.sha256()
    for module, qualname in DOCUMENT_EMBEDDING_CODE:
        obj = import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        code.update(f"{module}:{qualname}\0".encode() + inspect.getsource(obj).encode() + b"\0")
    packages = {}
    for name in DOCUMENT_EMBEDDING_PACKAGES:
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            packages[name] = None
    return {"model": emb.model, "dimension": emb.dimension, "weights_sha256": weights.hexdigest(),
            "document_code_sha256": code.hexdigest(), "packages": packages, "window": emb.window}


def _seed_file(es: EvalSet) -> Path:
    return OUT / "seed" / f"{es.name}.npz"


def _dump_seed(es: EvalSet, cfg_path: Path) -> int:
    """chunk hash -> vector of the built index, for seeding a later build of the same set."""
    import numpy as np

    from kb_assets.config import load_config
    from kb_assets.store.db import connect, open_database
    from kb_assets.store.spaces import active_space

    cfg = load_config(cfg_path)
    with connect(open_database(cfg)) as conn:
        # a stopped build has not activated its space yet: take the configured model's
        space = active_space(conn) or conn.execute(
            "SELECT model, dimension, table_name FROM embedding_spaces WHERE model = %s ORDER BY dimension",
            (cfg.local.model,)).fetchone()
        if space is None:
            return 0
        rows = conn.execute(f'SELECT chunk_hash, embedding::text FROM "{space[2]}"').fetchall()
    keys = np.array([r[0] for r in rows])
    vecs = np.array([json.loads(r[1]) for r in rows], dtype=np.float32).reshape(len(rows), -1)
    identity = json.dumps(document_vector_identity(cfg), sort_keys=True)
    out = _seed_file(es)
    if out.exists():   # keep the older seed's other vectors (a subset build must not shrink a full set's seed)
        z = np.load(out)
        if "identity" in z.files and str(z["identity"][0]) == identity and len(z["keys"]):
            have = set(keys.tolist())
            extra = np.array([k not in have for k in z["keys"].tolist()], dtype=bool)
            if extra.any():
                keys = np.concatenate([keys, z["keys"][extra]]) if len(keys) else z["keys"][extra]
                vecs = np.concatenate([vecs, z["vecs"][extra]]) if len(vecs) else z["vecs"][extra]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.stem + ".tmp.npz")
    np.savez(tmp, keys=keys, vecs=vecs, model=np.array([space[0]]), identity=np.array([identity]))
    tmp.replace(out)
    return len(rows)


def _seed(es: EvalSet, cfg_path: Path) -> int:
    import numpy as np

    f = _seed_file(es)
    if not f.exists():
        return 0
    z = np.load(f)
    from kb_assets.config import load_config
    from kb_assets.embedding.local import LocalEmbedder
    from kb_assets.store.db import connect, open_database
    from kb_assets.store.spaces import ensure_space

    cfg = load_config(cfg_path)
    emb = LocalEmbedder(cfg.local)
    then = json.loads(str(z["identity"][0])) if "identity" in z.files else None
    now = document_vector_identity(cfg)
    if then != now:
        differ = sorted(k for k in now if then is None or then.get(k) != now[k])
        log(f"{es.name}: not seeding: document vectors could differ from the seed's ({', '.join(differ)})")
        return 0
    with connect(open_database(cfg)) as conn:
        table = ensure_space(conn, emb.model, emb.dimension)
        with conn.transaction():
            conn.execute("CREATE TEMP TABLE seed (chunk_hash text, embedding text) ON COMMIT DROP")
            with conn.cursor().copy("COPY seed (chunk_hash, embedding) FROM STDIN") as cp:
                for k, v in zip(z["keys"].tolist(), z["vecs"]):
                    cp.write_row((k, "[" + ",".join(f"{x:.8g}" for x in v.tolist()) + "]"))
            n = conn.execute(f'INSERT INTO "{table}" (chunk_hash, embedding) SELECT chunk_hash, embedding::vector'
                             " FROM seed ON CONFLICT (chunk_hash) DO NOTHING").rowcount
    return n


def build_index(es: EvalSet, *, seed: bool = True, force: bool = False, adopt: bool = False,
                stale_ok: bool = False) -> dict:
    """The set's index, built by `kb index` (subprocess) or reused from the cache; returns its info.
    `stale_ok`: when this key was never built, the newest finished build of the set instead (query-only work:
    the ranking code is not in the key), never a build."""
    key = set_key(es)
    work = OUT / "index" / f"{es.name}-{key}"
    info_file = work / "built.json"
    if stale_ok and not info_file.exists() and not force:
        done = sorted((OUT / "index").glob(f"{es.name}-*/built.json"), key=lambda p: p.stat().st_mtime)
        if not done:
            sys.exit(f"quality: --stale-ok: {es.name} has no finished build in {OUT / 'index'}: build it first")
        log(f"{es.name}: key {key} not built; --stale-ok: evaluating {done[-1].parent.name}")
        info_file = done[-1]
    if info_file.exists() and not force:
        info = json.loads(info_file.read_text())
        info["reused"] = True
        return info
    if adopt and (work / "kb.yaml").exists():
        # a `kb index` of this key that finished without its parent (e.g. the harness was stopped): take it
        # as built once every chunk has its vector
        from kb_assets.config import load_config
        from kb_assets.store.db import connect, open_database
        from kb_assets.store.spaces import active_space

        with connect(open_database(load_config(work / "kb.yaml"))) as conn:
            space = active_space(conn)
            missing = conn.execute(f'SELECT count(*) FROM chunks c WHERE NOT EXISTS (SELECT 1 FROM "{space[2]}" e'
                                   " WHERE e.chunk_hash = c.chunk_hash)").fetchone()[0] if space else -1
        if missing == 0:
            dumped = _dump_seed(es, work / "kb.yaml")
            info = {"set": es.name, "key": key, "config": str(work / "kb.yaml"), "seconds": None,
                    "load_avg_after": load_avg(), "seeded_vectors": None, "vectors": dumped, "adopted": True,
                    "built_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
            info_file.write_text(json.dumps(info, indent=1, default=str))
            info["reused"] = True
            return info
        sys.exit(f"quality: {work} is not a finished index ({missing} chunks without a vector)")
    if work.exists():
        _stop_server(work / "data")
        shutil.rmtree(work)
    work.mkdir(parents=True)
    cfg_path = write_config(es, work)
    seconds, seeded, sources = 0.0, 0, []
    # One `kb index --source` per source, seeding before each: indexing a source removes vectors no chunk
    # uses yet (orphans), which would drop the seed of the sources still to come.
    with tempfile.TemporaryDirectory(prefix="kb-quality-dh-") as dh:
        for src in es.sources:
            n = _seed(es, cfg_path) if seed else 0
            seeded = max(seeded, n)
            _stop_server(work / "data")
            log(f"{es.name}: kb index --source {src.key} (key {key}, {n} vectors seeded, load {load_avg()})")
            env = _env()
            env["DAGSTER_HOME"] = dh
            t0 = time.time()
            proc = subprocess.run([str(Path(sys.executable).with_name("kb")), "index", "--config", str(cfg_path),
                                   "--source", src.key, "--json", "--wait-index"], cwd=work, env=env, capture_output=True,
                                  text=True)   # --wait-index: evaluated on the HNSW index, not an exact scan
            seconds += time.time() - t0
            with open(work / "index.log", "a") as fh:
                fh.write(proc.stdout + "\n--- stderr\n" + proc.stderr)
            if proc.returncode != 0:
                sys.exit(f"quality: `kb index` failed for {es.name} (exit {proc.returncode}); see {work / 'index.log'}")
            sources += json.loads(proc.stdout[proc.stdout.index("{"):]).get("sources") or []
    summary = {"sources": sources}
    dumped = _dump_seed(es, cfg_path)
    info = {"set": es.name, "key": key, "config": str(cfg_path), "seconds": round(seconds, 1),
            "load_avg_after": load_avg(), "seeded_vectors": seeded, "vectors": dumped,
            "sources": summary.get("sources"), "built_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    info_file.write_text(json.dumps(info, indent=1, default=str))
    log(f"{es.name}: indexed in {seconds:.0f} s")
    info["reused"] = False
    return info


def _stop_server(pgdata: Path) -> None:
    """Release this process's handle on an embedded server (pgserver stops it when the last one goes)."""
    try:
        from kb_assets.store import db
        for k in [k for k in getattr(db, "_servers", {}) if str(pgdata) in str(k)]:
            srv = db._servers.pop(k)
            try:
                srv.cleanup()
            except Exception:
                pass
    except Exception:
        pass


# ------------------------------------------------------------------------------------------------ baseline
_IDENT = re.compile(r"[A-Za-z][a-z]+|[A-Z]+(?![a-z])|\d+")


def split_identifiers(text: str) -> str:
    """`getHTTPResponse_code` / `a.b_c` -> the text plus its identifier parts (for BM25 over code)."""
    parts = []
    for tok in re.findall(r"[A-Za-z_][A-Za-z0-9_.]*", text):
        if "_" in tok or "." in tok or (tok[:1].islower() and any(c.isupper() for c in tok)) or \
                sum(c.isupper() for c in tok) > 1:
            parts += _IDENT.findall(tok)
    return text + "\n" + " ".join(parts)


def corpus_docs(es: EvalSet) -> dict[str, list[tuple[str, str, str]]]:
    """Per source key: (path, text, kind) of the files the set's sources include, read from disk.
    The baseline indexes the same files as kb (kb's own skips — empty or trivial files — aside)."""
    import fnmatch

    out: dict[str, list[tuple[str, str, str]]] = {}
    for s in es.sources:
        root = Path(s.root) if s.root else _unpack(s, corpus_dir(es, s))
        docs = []
        for f in sorted(root.rglob("*")):
            if not f.is_file():
                continue
            rel = f.relative_to(root).as_posix()
            # "**/" also matches no folder at all (as kb's globs do)
            def match(g: str) -> bool:
                return fnmatch.fnmatch(rel, g) or fnmatch.fnmatch(rel, g.replace("**/", ""))

            if not any(match(g) for g in s.include) or any(match(g) for g in s.exclude):
                continue
            text = f.read_text(encoding="utf-8", errors="replace")
            if len(text.strip()) < 1:
                continue
            kind = "code" if rel.endswith(".py") else "doc"
            docs.append((rel, text, kind))
        out[s.key] = docs
    return out


class Baseline:
    """bm25s (Lucene) + all-MiniLM-L6-v2 + RRF over one source's files."""

    def __init__(self, name: str, docs: list[tuple[str, str, str]], model):
        import bm25s
        import numpy as np
        import Stemmer

        self.paths = [p for p, _, _ in docs]
        self.kinds = [k for _, _, k in docs]
        self.stemmer = Stemmer.Stemmer("english")
        texts = [(split_identifiers(p + "\n" + t) if k == "code" else t) for p, t, k in docs]
        self.bm25 = bm25s.BM25(method="lucene", k1=1.5, b=0.75)
        self.bm25.index(bm25s.tokenize(texts, stopwords="en", stemmer=self.stemmer, show_progress=False),
                        show_progress=False)
        self.model = model
        # dense: one vector per prose document (the model reads its first 256 word pieces), 40-line windows
        # per code file (the file scores as its best window); cached by content
        units, owner = [], []
        for i, (p, t, k) in enumerate(docs):
            if k == "code":
                lines = t.splitlines()
                for a in range(0, max(1, len(lines)), 40):
                    units.append("\n".join(lines[a:a + 40]))
                    owner.append(i)
            else:
                units.append(t[:6000])     # well past 256 word pieces; the model truncates there
                owner.append(i)
        h = hashlib.sha256(("\0".join(units)).encode()).hexdigest()[:16]
        cache = OUT / "baseline" / f"{name}-{h}.npy"
        if cache.exists():
            vecs = np.load(cache)
        else:
            log(f"baseline {name}: embedding {len(units)} texts")
            vecs = model.encode(units, batch_size=32, normalize_embeddings=True, convert_to_numpy=True,
                                show_progress_bar=False).astype(np.float32)
            cache.parent.mkdir(parents=True, exist_ok=True)
            np.save(cache, vecs)
        self.vecs, self.owner = vecs, np.array(owner)

    def rank(self, query: str, qvec, kinds: set[str] | None = None, depth: int = 100) -> dict[str, list[str]]:
        import bm25s
        import numpy as np

        allowed = [i for i, k in enumerate(self.kinds) if kinds is None or k in kinds]
        allowed_set = set(allowed)
        qt = bm25s.tokenize([query], stopwords="en", stemmer=self.stemmer, show_progress=False)
        scores = self.bm25.get_scores(qt.vocab and [w for w in _tokens_of(qt)] or [])
        kw = [i for i in np.argsort(-scores, kind="stable") if i in allowed_set and scores[i] > 0][:depth]
        sims = self.vecs @ np.asarray(qvec, dtype=np.float32)
        best = np.full(len(self.paths), -2.0, dtype=np.float32)
        np.maximum.at(best, self.owner, sims)
        vec = [i for i in np.argsort(-best, kind="stable") if i in allowed_set][:max(depth, 1000)]
        fused: dict[int, float] = {}
        for ranking in (kw, vec):
            for r, i in enumerate(ranking[:1000], 1):
                fused[i] = fused.get(i, 0.0) + 1.0 / (60 + r)
        hy = sorted(fused, key=lambda i: (-fused[i], i))
        name = lambda xs: [self.paths[i] for i in xs[:depth]]  # noqa: E731
        return {"keyword": name(kw), "vector": name(vec), "hybrid": name(hy)}


def _tokens_of(tokenized) -> list[str]:
    inv = {v: k for k, v in tokenized.vocab.items()}
    return [inv[i] for i in tokenized.ids[0]]


def load_model():
    from kb_assets.embedding.local import load_model as _load, packaged_model_dir
    return _load(packaged_model_dir())


# ------------------------------------------------------------------------------------------------ kb
class MemoEmbedder:
    """kb's local embedder with a per-run query cache (many settings, one embedding per query)."""

    def __init__(self, cfg):
        from kb_assets.embedding import make_embedder
        self.inner = make_embedder(cfg)
        self.model, self.dimension = self.inner.model, self.inner.dimension
        self.cache: dict[str, list[float]] = {}

    def embed_query(self, text: str) -> list[float]:
        if text not in self.cache:
            self.cache[text] = self.inner.embed_query(text)
        return self.cache[text]


def kb_runs(es: EvalSet, cfg, conn, emb, queries, *, modes=("keyword", "vector", "hybrid"), tuning=None,
            gate: bool = False, depth: int = 100) -> dict[str, dict[str, list[str]]]:
    """mode -> qid -> ranked paths within the query's section (code / documents)."""
    from dataclasses import replace

    from kb_assets.query import Tuning, recall
    from kb_assets.query.engine import squash

    base = tuning or Tuning()
    t = replace(base, gate=gate)
    kinds = {}
    for src, path, kind in conn.execute("SELECT source_key, path, kind FROM documents WHERE status = 'active'"):
        kinds[f"kb:{src}/{path}"] = kind
    out: dict[str, dict[str, list[str]]] = {}
    for mode in modes:
        run = {}
        for q in queries:
            r = recall(q["query"], config=cfg, conn=conn, embedder=emb, mode=mode, tuning=t, ranked_ids=True,
                       limit=depth, code_limit=depth, source=q.get("source"))
            want_code = q["section"] == "code"
            run[q["id"]] = [i.split("/", 1)[1] for i, _ in r.ranked[0]
                            if (kinds.get(i) == "code") == want_code][:depth]
        out[mode] = run
    _ = squash
    return out


def off_topic_counts(es: EvalSet, cfg, conn, emb, tuning=None) -> dict[str, list[int]]:
    from kb_assets.query import recall
    src = es.sources[0].key if len(es.sources) == 1 else None
    out = {}
    for mode in ("hybrid", "keyword"):
        out[mode] = [len(recall(t, config=cfg, conn=conn, embedder=emb, mode=mode, tuning=tuning, source=src).documents)
                     + len(recall(t, config=cfg, conn=conn, embedder=emb, mode=mode, tuning=tuning, source=src).code)
                     for t in es.off_topic]
    return out


METRICS = ("ndcg@10", "recall@5", "recall@10", "recall@100", "mrr@10")


def score(run: dict[str, list[str]], qrels) -> dict[str, float]:
    from kb_assets.query.metrics import evaluate
    m = evaluate(run, qrels)
    return {k: round(m[k], 4) for k in METRICS}


# ------------------------------------------------------------------------------------------------ variants
# Ranking variants evaluated side by side (--variants): name -> (Tuning fields, QuerySettings fields).
# Relative to the defaults before this work (chunk-level IDF keyword channel, 24 lexemes / 6,000 postings /
# df 0.2, relative gate for every query):
BEFORE = {"keyword_bm25": False, "keyword_max_terms": 24, "keyword_postings": 6000, "keyword_max_df": 0.2,
          "gate_strong_floor": False, "title_weight": 0.0, "code_keyword_factor": 1.0, "code_document_factor": 1.0}
CANDIDATE = "default"
GATE_VARIANTS = ("before", "default", "default_title0", "default_title0.5", "default_code_plain",
                 "default_impute_window", "default_impute_listed", "default_impute_dense",
                 "default_weak0.05", "default_weak0.1", "previous", "default_no_impute", "default_no_weak",
                 "default_no_null_floor", "default_null_floor_at_null")   # also measured with the gate on
VARIANTS: dict[str, tuple[dict, dict]] = {
    "before": (BEFORE, {}),
    "bm25": ({**BEFORE, "keyword_bm25": True}, {}),
    # BM25, 48 lexemes / 12,000 postings / df 0.4, gate_strong_floor, title weight 0.25 (+ identifiers split)
    "default": ({}, {}),
    "default_terms24": ({"keyword_max_terms": 24, "keyword_postings": 6000, "keyword_max_df": 0.2}, {}),
    "default_title0": ({"title_weight": 0.0}, {}),
    "default_title0.5": ({"title_weight": 0.5}, {}),
    "default_title1": ({"title_weight": 1.0}, {}),
    "default_b0.5": ({"bm25_b": 0.5}, {}),
    "default_kw1.5": ({}, {"keyword_weight": 1.5}),
    "default_doc0.5": ({}, {"document_weight": 0.5}),
    "default_decay0": ({"doc_decay": 0.0}, {}),
    "default_rrf20": ({}, {"rrf_k": 20}),
    # the dense signal of each candidate's opening (first chunk: title + first window) beside its best chunk
    "default_opening0.5": ({"opening_weight": 0.5}, {}),
    "default_opening1": ({"opening_weight": 1.0}, {}),
    "default_decay0.5": ({"doc_decay": 0.5}, {}),
    "default_doc0": ({}, {"document_weight": 0.0}),
    "default_b0.9": ({"bm25_b": 0.9}, {}),
    # the keyword channel's term frequency as occurrences in the whole document (whole-file BM25, as the
    # baseline's), for every kind or for code only
    "default_tf_occ": ({"bm25_tf": "occurrences"}, {}),
    "default_tf_code_occ": ({"bm25_tf": "code_occurrences"}, {}),
    # code files fused with the same channel weights as prose (the defaults before 2026-12-02), and the
    # neighbours of the code factors (keyword × 1.5, document vector × 0.5)
    "default_code_plain": ({"code_keyword_factor": 1.0, "code_document_factor": 1.0}, {}),
    "default_code_kw1.25": ({"code_keyword_factor": 1.25}, {}),
    "default_code_kw2": ({"code_keyword_factor": 2.0}, {}),
    "default_code_doc0.25": ({"code_document_factor": 0.25}, {}),
    "default_code_doc1": ({"code_document_factor": 1.0}, {}),
    # twice the document-vector channel's candidates (PEPs Recall@100: gold documents the keyword channel alone
    # ranks 43-147 get a second channel's rank; docs/QUALITY.md "Fifth pass")
    "default_docwin200": ({}, {"document_window": 200}),
    # RRF with imputed ranks (Tuning.impute_rank): a document absent from a truncated channel fuses as if at its
    # cut + 1 — the window's ("window") or the number of documents listed ("listed"); "dense": only the two
    # vector channels impute, "kw": only the keyword channel
    "default_impute_window": ({"impute_rank": "window"}, {}),
    "default_impute_listed": ({"impute_rank": "listed"}, {}),
    "default_impute_dense": ({"impute_rank": "window", "impute_channels": ("vector", "document")}, {}),
    "default_impute_kw": ({"impute_rank": "window", "impute_channels": ("keyword",)}, {}),
    # the gate's weak band (Tuning.gate_weak_margin): a query below the index's null level + 0.2 keeps only
    # results within this margin of its best (ranking with the gate off is unchanged by it)
    "default_weak0.05": ({"gate_weak_margin": 0.05}, {}),
    "default_weak0.1": ({"gate_weak_margin": 0.1}, {}),
    # the defaults before 2026-12-03 (no imputed ranks, no weak band), and each of the two changes left out
    "previous": ({"impute_rank": "off", "gate_weak_margin": None}, {}),
    "default_no_impute": ({"impute_rank": "off"}, {}),
    "default_no_weak": ({"gate_weak_margin": None}, {}),
    # the gate's null floor (Tuning.gate_null_floor, 2026-12-03) left out: the gate before it
    "default_no_null_floor": ({"gate_null_floor": False}, {}),
    # the null floor at the null level itself, no BM25 witness needed just above it (2026-12-03, "Seventh pass")
    "default_null_floor_at_null": ({"gate_null_floor_margin": 0.0}, {}),
}
# Measured once and left out of the grid (docs/QUALITY.md): common query words too, as the baseline's BM25
# reads every word (code_history hybrid 0.745 for both against 0.753).
EXTRA_VARIANTS = {
    "default_df1": ({"keyword_max_df": 1.0, "keyword_postings": 50000, "keyword_max_terms": 64}, {}),
    "default_df0.7": ({"keyword_max_df": 0.7, "keyword_postings": 25000}, {}),
    # the keyword channel's postings budget alone (its cost on real text: docs/BENCHMARKS.md, "On a real index")
    "default_postings6000": ({"keyword_postings": 6000}, {}),
    "default_postings8000": ({"keyword_postings": 8000}, {}),
}


def leave_one_set_out(results: dict, dev_sets: list[str]) -> list[dict]:
    """For each dev set: the variant with the best mean hybrid nDCG@10 on the OTHER dev sets (ties: the
    earlier variant), and what it scores on the held-out set, beside the default's figure there."""
    out = []
    names = [n for n in VARIANTS if all(n in results[s].get("variants", {}) for s in dev_sets)]
    for held in dev_sets:
        others = [s for s in dev_sets if s != held]
        best = max(names, key=lambda n: (sum(results[s]["variants"][n]["hybrid"]["ndcg@10"] for s in others)
                                          / len(others), -names.index(n)))
        out.append({"held_out": held, "chosen_on": others, "variant": best,
                    "held_out_ndcg@10": results[held]["variants"][best]["hybrid"]["ndcg@10"],
                    "held_out_recall@100": results[held]["variants"][best]["hybrid"]["recall@100"],
                    "default_ndcg@10": results[held]["variants"]["default"]["hybrid"]["ndcg@10"],
                    "before_ndcg@10": results[held]["variants"].get("before", {}).get("hybrid", {}).get("ndcg@10",
                                                                                                      float("nan")),
                    "baseline_ndcg@10": results[held]["baseline"]["hybrid"]["ndcg@10"]})
    return out


def with_settings(cfg, over: dict):
    return cfg.model_copy(update={"query": cfg.query.model_copy(update=over)}) if over else cfg


# ------------------------------------------------------------------------------------------------ run
def evaluate_set(es: EvalSet, info: dict, model, *, variants: list[str] | None = None) -> dict:
    from kb_assets.config import load_config
    from kb_assets.query import Tuning
    from kb_assets.store.db import connect, open_database

    cfg = load_config(info["config"])
    conn = connect(open_database(cfg), register=False)
    emb = MemoEmbedder(cfg)
    queries, qrels = es.queries(), es.qrels()
    res: dict[str, Any] = {"queries": len(queries), "judged": sum(1 for q in queries if q["id"] in qrels),
                           "index": {k: info.get(k) for k in ("key", "seconds", "load_avg_after", "seeded_vectors",
                                                              "vectors", "built_at", "reused")}}
    res["documents"], res["chunks"] = conn.execute(
        "SELECT (SELECT count(*) FROM documents WHERE status = 'active'), (SELECT count(*) FROM chunks)").fetchone()
    t0 = time.time()
    kb = kb_runs(es, cfg, conn, emb, queries, gate=False)
    res["kb"] = {m: score(run, qrels) for m, run in kb.items()}
    kb_g = kb_runs(es, cfg, conn, emb, queries, modes=("hybrid", "keyword"), gate=True)
    res["kb_gate_on"] = {m: score(run, qrels) for m, run in kb_g.items()}
    res["kb_gate_on_results_mean"] = {m: round(sum(len(v) for v in run.values()) / max(1, len(run)), 1)
                                      for m, run in kb_g.items()}
    res["off_topic_results"] = off_topic_counts(es, cfg, conn, emb)
    # the gate before the index's null level (query/gate.py), in the same run: before / after
    old_gate = Tuning(gate_null=False)
    kb_o = kb_runs(es, cfg, conn, emb, queries, modes=("hybrid",), tuning=old_gate, gate=True)
    res["kb_gate_fixed_floor"] = {m: score(run, qrels) for m, run in kb_o.items()}
    res["off_topic_results_fixed_floor"] = off_topic_counts(es, cfg, conn, emb, old_gate)
    res["kb_seconds"] = round(time.time() - t0, 1)
    # baseline, same queries, same query vectors
    t0 = time.time()
    docs = corpus_docs(es)
    bases = {k: Baseline(f"{es.name}-{k}", d, model) for k, d in docs.items()}
    bruns: dict[str, dict[str, list[str]]] = {"keyword": {}, "vector": {}, "hybrid": {}}
    for q in queries:
        keys = [q["source"]] if q.get("source") in bases else list(bases)
        kinds = {"code"} if q["section"] == "code" else {"doc"}
        qvec = emb.embed_query(q["query"])
        for k in keys:   # one source per query in every set here
            for m, ranked in bases[k].rank(q["query"], qvec, kinds).items():
                bruns[m][q["id"]] = ranked
    res["baseline"] = {m: score(run, qrels) for m, run in bruns.items()}
    res["baseline_documents"] = sum(len(d) for d in docs.values())
    res["baseline_seconds"] = round(time.time() - t0, 1)
    res["per_query"] = {"kb_hybrid": _per_query(kb["hybrid"], qrels), "baseline_hybrid": _per_query(
        bruns["hybrid"], qrels), "baseline_keyword": _per_query(bruns["keyword"], qrels)}
    if variants:
        res["variants"] = {}
        for name in variants:
            tfields, sfields = VARIANTS.get(name) or EXTRA_VARIANTS[name]
            vcfg = with_settings(cfg, sfields)
            runs = kb_runs(es, vcfg, conn, emb, queries, modes=("hybrid", "keyword"), tuning=Tuning(**tfields),
                           gate=False)
            res["variants"][name] = {m: score(run, qrels) for m, run in runs.items()}
            res["variants"][name]["per_query_hybrid"] = _per_query(runs["hybrid"], qrels)
            if name in GATE_VARIANTS:
                g = kb_runs(es, vcfg, conn, emb, queries, modes=("hybrid",), tuning=Tuning(**tfields), gate=True)
                res["variants"][name]["hybrid_gate_on"] = score(g["hybrid"], qrels)
                res["variants"][name]["off_topic_results"] = off_topic_counts(es, vcfg, conn, emb, Tuning(**tfields))
    conn.close()
    return res


def _per_query(run, qrels) -> dict[str, float]:
    from kb_assets.query.metrics import evaluate
    return {q: round(m["ndcg@10"], 4) for q, m in evaluate(run, qrels)["per_query"].items()}


def render(results: dict, command: str) -> str:
    lines = [f"Command: `{command}` — load average when written {load_avg()} (2 shared cores; sets were evaluated at 2-20).", ""]
    for name, r in results.items():
        lines.append(f"**{name}** — {r['queries']} queries ({r['judged']} judged), kb: {r['documents']} documents /"
                     f" {r['chunks']} chunks (index key `{r['index']['key']}`, built {r['index']['built_at']},"
                     f" {r['index']['seconds']} s); baseline: {r['baseline_documents']} files.")
        lines.append("")
        lines.append("| mode | system | " + " | ".join(m.replace("recall", "R").replace("ndcg", "nDCG").replace("mrr", "MRR")
                                                      for m in METRICS) + " |")
        lines.append("| --- | --- |" + " ---: |" * len(METRICS))
        for mode in ("keyword", "vector", "hybrid"):
            for sysname, block in (("kb", r["kb"]), ("baseline", r["baseline"])):
                lines.append(f"| {mode} | {sysname} | " + " | ".join(f"{block[mode][m]:.3f}" for m in METRICS) + " |")
        for mode, block in r["kb_gate_on"].items():
            lines.append(f"| {mode}, gate on | kb | " + " | ".join(f"{block[m]:.3f}" for m in METRICS) + " |")
        for mode, block in r.get("kb_gate_fixed_floor", {}).items():
            lines.append(f"| {mode}, gate on, fixed floor only (before) | kb | "
                         + " | ".join(f"{block[m]:.3f}" for m in METRICS) + " |")
        ot = r["off_topic_results"]
        lines.append("")
        lines.append(f"Off-topic queries ({len(ot['hybrid'])}), results returned (gate on, default limits): hybrid"
                     f" {ot['hybrid']}, keyword {ot['keyword']}. Mean results per judged query, gate on:"
                     f" {r['kb_gate_on_results_mean']}.")
        if "off_topic_results_fixed_floor" in r:
            lines.append(f"Before (the gate with the fixed floor only): hybrid {r['off_topic_results_fixed_floor']['hybrid']}.")
        lines.append("")
    return "\n".join(lines)


def render_variants(results: dict, loso: list[dict] | None) -> str:
    sets = [s for s in results if results[s].get("variants")]
    if not sets:
        return ""
    names = [n for n in VARIANTS if all(n in results[s]["variants"] for s in sets)]
    lines = ["**Ranking variants** (gate off; hybrid nDCG@10 / keyword-mode nDCG@10 per set; `before` = the defaults"
             " before this work, `default` = now; the other rows change one thing from `default`):", "",
             "| variant | " + " | ".join(sets) + " |", "| --- |" + " ---: |" * len(sets)]
    for n in names:
        lines.append(f"| {n} | " + " | ".join(
            f"{results[s]['variants'][n]['hybrid']['ndcg@10']:.3f} / {results[s]['variants'][n]['keyword']['ndcg@10']:.3f}"
            for s in sets) + " |")
    lines += ["", "Hybrid Recall@100 per variant (gate off):", "",
              "| variant | " + " | ".join(sets) + " |", "| --- |" + " ---: |" * len(sets)]
    for n in names:
        lines.append(f"| {n} | " + " | ".join(f"{results[s]['variants'][n]['hybrid']['recall@100']:.3f}"
                                             for s in sets) + " |")
    lines.append("")
    lines.append("Gate on (hybrid nDCG@10 / Recall@100, and results returned for each off-topic query):")
    lines.append("")
    for n in GATE_VARIANTS:
        cells = []
        for s in sets:
            v = results[s]["variants"].get(n, {})
            if "hybrid_gate_on" in v:
                cells.append(f"{s} {v['hybrid_gate_on']['ndcg@10']:.3f} / {v['hybrid_gate_on']['recall@100']:.3f}"
                             f" (gate off {v['hybrid']['recall@100']:.3f}), off-topic {v['off_topic_results']['hybrid']}")
        if cells:
            lines.append(f"- `{n}`: " + "; ".join(cells))
    if loso:
        lines += ["", "**Leave one set out** (the variant with the best mean hybrid nDCG@10 on the other sets, scored on"
                  " the held-out one):", "", "| held out | chosen on the others | its nDCG@10 there | `default` | `before` |"
                  " baseline hybrid |", "| --- | --- | ---: | ---: | ---: | ---: |"]
        for r in loso:
            lines.append(f"| {r['held_out']} | {r['variant']} | {r['held_out_ndcg@10']:.3f} | {r['default_ndcg@10']:.3f} |"
                         f" {r['before_ndcg@10']:.3f} | {r['baseline_ndcg@10']:.3f} |")
    return "\n".join(lines) + "\n"


DOC_BEGIN = "<!-- quality.py:begin -->"
DOC_END = "<!-- quality.py:end -->"


def write_doc(text: str, tag: str = "") -> None:
    doc = ROOT / "docs" / "QUALITY.md"
    cur = doc.read_text(encoding="utf-8")
    begin, end = (f"<!-- quality.py:{tag}:begin -->", f"<!-- quality.py:{tag}:end -->") if tag else (DOC_BEGIN, DOC_END)
    block = f"{begin}\n{text}\n{end}"
    if begin in cur:
        a, b = cur.index(begin), cur.index(end) + len(end)
        cur = cur[:a] + block + cur[b:]
    else:
        cur = cur.rstrip() + "\n\n## Quality on several sets, kb beside a plain baseline (bench/quality.py)\n\n" + block + "\n"
    doc.write_text(cur, encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="regression,code_history,rust_rfcs,peps_whatsnew")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--cache-dir", default=None, help="indexes, seeds, unpacked corpora, baseline vectors and "
                    f"results (default $KB_QUALITY_CACHE or {DEFAULT_CACHE.relative_to(ROOT)})")
    ap.add_argument("--rebuild", action="store_true", help="build the indexes again even when the key matches")
    ap.add_argument("--no-seed", action="store_true", help="build without seeding chunk vectors")
    ap.add_argument("--save-seed", action="store_true", help="add the vectors of each set's newest index folder, "
                    "finished or not (a build that was stopped), to its seed, and exit")
    ap.add_argument("--adopt", action="store_true", help="take an index whose `kb index` finished without the "
                    "harness (it was stopped meanwhile) once every chunk has its vector")
    ap.add_argument("--variants", nargs="?", const="all", default=None,
                    help="evaluate ranking variants (comma-separated names, or all)")
    ap.add_argument("--doc", action="store_true", help="rewrite the figures section of docs/QUALITY.md")
    ap.add_argument("--report-only", action="store_true", help="only render bench/out/quality/results.json")
    ap.add_argument("--from-results", action="store_true", help="report every set in results.json, also those "
                    "evaluated by earlier runs")
    ap.add_argument("--label", default="", help="a note printed above the tables (e.g. 'unrepaired index')")
    ap.add_argument("--stale-ok", action="store_true", help="evaluate the newest finished build of a set whose "
                    "current index key was never built, instead of building (query-only changes)")
    ap.add_argument("--results", default="results.json", help="results file in the cache (default results.json; "
                    "another name keeps one helper's runs apart from the others')")
    ap.add_argument("--doc-tag", default="", help="with --doc: write between <!-- quality.py:TAG:begin/end --> "
                    "(one's own subsection) instead of the shared block")
    args = ap.parse_args()
    if args.cache_dir:
        global OUT
        OUT = Path(args.cache_dir).expanduser().resolve()
    log(f"cache: {OUT}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    sets = make_sets()
    chosen = [s for s in args.sets.split(",") if s]
    for s in chosen:
        if s not in sets:
            sys.exit(f"quality: unknown set {s!r}: use {', '.join(sets)}")
    if args.report_only:   # render results.json as it is (each set as measured on its own index key)
        results = {s: r for s, r in json.loads((OUT / args.results).read_text()).items() if s in chosen}
        loso = leave_one_set_out(results, [s for s in results if results[s].get("variants")]) \
            if len([s for s in results if results[s].get("variants")]) >= 3 else None
        text = (f"_{args.label}_\n\n" if args.label else "") + render(results, "python bench/quality.py --variants")
        text += "\n" + render_variants(results, loso)
        print(text)
        if args.doc:
            write_doc(text, args.doc_tag)
        return
    if args.save_seed:   # keep what a stopped build paid for: the next build of the set is seeded with it
        for s in chosen:
            dirs = sorted((OUT / "index").glob(f"{s}-*/kb.yaml"), key=lambda p: p.stat().st_mtime)
            if dirs:
                log(f"{s}: {_dump_seed(sets[s], dirs[-1])} vectors of {dirs[-1].parent.name} added to "
                    f"{_seed_file(sets[s])}")
                _stop_server(dirs[-1].parent / "data")
        return
    infos = {}
    for s in chosen:
        infos[s] = build_index(sets[s], seed=not args.no_seed, force=args.rebuild, adopt=args.adopt,
                               stale_ok=args.stale_ok)
    if args.build_only:
        print(json.dumps(infos, indent=1, default=str))
        return
    model = load_model()
    variants = None if args.variants is None else (list(VARIANTS) if args.variants == "all" else args.variants.split(","))
    results = {}
    for s in chosen:
        log(f"{s}: evaluating (load {load_avg()})")
        results[s] = evaluate_set(sets[s], infos[s], model, variants=variants)
    OUT.mkdir(parents=True, exist_ok=True)
    # sets evaluated in earlier runs stay in the file (their index key says which build they measured)
    prev = json.loads((OUT / args.results).read_text()) if (OUT / args.results).exists() else {}
    (OUT / args.results).write_text(json.dumps({**prev, **results}, indent=1, default=str))
    if args.from_results:   # report every set of the file (each measured on its own index key)
        results = {**prev, **results}
    command = "python bench/quality.py" + (f" --sets {args.sets}" if args.sets != ap.get_default("sets") else "")
    text = (f"_{args.label}_\n\n" if args.label else "") + render(results, command)
    print(text)
    if variants:
        for s, r in results.items():
            for name, m in r.get("variants", {}).items():
                print(f"{s:14} {name:16} hybrid " + " ".join(f"{m['hybrid'][k]:.3f}" for k in METRICS)
                      + "  keyword " + " ".join(f"{m['keyword'][k]:.3f}" for k in METRICS))
    loso = None
    if variants and len([s for s in results if results[s].get("variants")]) >= 3:
        loso = leave_one_set_out(results, [s for s in ("rust_rfcs", "code_history", "peps_whatsnew", "regression")
                                           if results.get(s, {}).get("variants")])
    if loso:
        (OUT / "loso.json").write_text(json.dumps(loso, indent=1))
    text += "\n" + render_variants(results, loso)
    print(render_variants(results, loso))
    if args.doc:
        write_doc(text, args.doc_tag)


if __name__ == "__main__":
    main()
