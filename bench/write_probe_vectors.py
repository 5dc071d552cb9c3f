"""Write kb_assets/query/probe_vectors.npz: the relevance gate's probe questions embedded by the packaged local
model's query encoder (kb_assets/query/gate.py, PROBE_QUERIES). Re-run after changing the probes or the
packaged model; kb_assets_tests/test_gate.py fails until then.

    HF_HUB_OFFLINE=1 python bench/write_probe_vectors.py
"""
from kb_assets.embedding.local import LocalEmbedder
from kb_assets.query.gate import write_probe_vectors

if __name__ == "__main__":
    print(write_probe_vectors(LocalEmbedder()))
