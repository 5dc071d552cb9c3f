"""find_secrets over the first N files of a folder, one process, 3 rounds: CPU seconds, MB/s, findings and a
digest of them (compare two checkouts: the script imports kb_assets from the one given).

    .venv/bin/python bench/secret_scan_bench.py /work/main /tmp/pb/work/synth 1000
    .venv/bin/python bench/secret_scan_bench.py . /tmp/pb/work/synth 1000 [prof]
"""
import sys, time, glob, os, hashlib
sys.path.insert(0, sys.argv[1])
from kb_assets.sources.redaction import find_secrets, config_style_for
root = sys.argv[2]; n = int(sys.argv[3]); prof = len(sys.argv) > 4 and sys.argv[4] == "prof"
files = sorted(f for f in glob.glob(root + "/**/*", recursive=True) if os.path.isfile(f))[:n]
texts = [(f, open(f, encoding="utf-8", errors="replace").read()) for f in files]
mb = sum(len(t) for _, t in texts) / 1e6
find_secrets("warm up aws key = 'x'")
def run():
    h = hashlib.sha256(); k = 0
    t = time.process_time()
    for f, s in texts:
        r = find_secrets(s, config_style=config_style_for(f)); k += len(r)
        h.update(repr(r).encode())
    return round(time.process_time() - t, 3), k, h.hexdigest()[:16]
if prof:
    import cProfile, pstats
    cProfile.run("r = run()", "/tmp/stg/sec.prof"); print(r)
    pstats.Stats("/tmp/stg/sec.prof").sort_stats("tottime").print_stats(15)
else:
    for _ in range(3):
        c, k, d = run(); print(len(texts), "files", f"{mb:.1f} MB", c, "s", f"{mb/c:.1f} MB/s", k, "findings", d)
