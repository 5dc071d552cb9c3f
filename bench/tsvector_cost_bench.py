"""python bench/tsvector_cost_bench.py

Cost of migration 009's tsvector (identifier parts) on chunk inserts: the same real chunk texts COPYed into
two tables, the old generated column vs the new, interleaved, one embedded PostgreSQL."""
import sys, time, os, glob, tarfile, statistics, tempfile
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pathlib import Path
from kb_assets.store.db import connect, embedded_url
work = Path(tempfile.mkdtemp(prefix="kb-tsvbench-"))
conn = connect(embedded_url(work), register=False)
fn = open(ROOT / "kb_assets/store/migrations/009_identifier_words.sql").read()
fn = fn[fn.index("CREATE OR REPLACE FUNCTION"):fn.index("-- A generated column")]
conn.execute("CREATE SCHEMA IF NOT EXISTS tsvb"); conn.execute("SET search_path = tsvb"); conn.execute(fn)
texts = []
for pat, ext in (("code-encode+httpx-*.tar.gz", ".py"), ("code-pallets+click-*.tar.gz", ".py"), ("python-peps-*.tar.gz", ".rst")):
    with tarfile.open(sorted(glob.glob(str(ROOT.parent / "shared" / "corpora" / pat)))[0]) as tf:
        for m in tf.getmembers():
            if m.isfile() and m.name.endswith(ext):
                t = tf.extractfile(m).read().decode("utf-8", "replace")
                texts += [(m.name, t[i:i + 1200]) for i in range(0, min(len(t), 60000), 1200)]
            if len(texts) > 12000 * (1 + (ext == ".rst")):
                break
code = [t for t in texts if t[0].endswith(".py")][:6000]
prose = [t for t in texts if t[0].endswith(".rst")][:6000]
OLD = "setweight(to_tsvector('english', heading), 'A') || to_tsvector('english', text)"
NEW = OLD + " || setweight(to_tsvector('english', kb_identifier_words(heading || ' ' || text)), 'D')"
NEWB = OLD + " || strip(to_tsvector('english', translate(regexp_replace(regexp_replace(heading || ' ' || text, '([a-z0-9])([A-Z])', '\\1 \\2', 'g'), '([A-Z]+)([A-Z][a-z])', '\\1 \\2', 'g'), './_-', '    ')))"
for name, expr in (("old", OLD), ("new", NEW), ("newb", NEWB)):
    conn.execute(f"CREATE TABLE c_{name} (id serial, heading text, text text, tsv tsvector GENERATED ALWAYS AS ({expr}) STORED)")
    conn.execute(f"CREATE INDEX ON c_{name} USING gin (tsv)")
res = {}
for kind, rows in (("code", code), ("prose", prose)):
    for rnd in range(3):
        for name in (("old", "new", "newb") if rnd % 2 else ("newb", "new", "old")):
            conn.execute(f"TRUNCATE c_{name}")
            t0 = time.perf_counter()
            with conn.transaction():
                with conn.cursor().copy(f"COPY c_{name} (heading, text) FROM STDIN") as cp:
                    for path, t in rows:
                        cp.write_row((path, t.replace("\x00", "")))
            res.setdefault((kind, name), []).append(time.perf_counter() - t0)
print("load", os.getloadavg())
for kind in ("code", "prose"):
    o, n = statistics.median(res[(kind, "old")]), statistics.median(res[(kind, "new")])
    b = statistics.median(res[(kind, "newb")])
    print(f"{kind}: {len(code if kind == 'code' else prose)} chunks of <=1200 chars, COPY + tsvector + GIN: old {o:.2f} s, new {n:.2f} s (+{100 * (n / o - 1):.0f}%), whole-text variant {b:.2f} s (+{100 * (b / o - 1):.0f}%) median of 3")

