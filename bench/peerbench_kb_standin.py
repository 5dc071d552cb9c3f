"""`kb` for ../shared/peerbench with the harness's fixed-cost stand-in in place of kb's document encoders.

The harness's hook (peerbench/kb_hook) replaces `SentenceTransformer.encode` only. kb encodes documents without
torch (embedding/local.py: onnxruntime for every job since c3abb37, small jobs only before), so the hook never
reaches kb's encoder: with plain `kb`, kb pays the real model (~10 ms per full window of onnxruntime on two cores)
where CocoIndex pays the stand-in's 2 ms per text. This wrapper charges kb's torch-free encoders the same stand-in
(pb_embed.FakeModel: a hash vector and PEERBENCH_FAKE_SLEEP s per text); everything else — the session set-up, the
other stages, the process — is kb's own. It counts the texts in a stats file of the harness's own form, so `texts`
is reported.

    cd ../shared/peerbench && python bench.py --matrix kb:synth:fake,coco:synth:fake \\
        --kb-cmd "<kb venv>/bin/python <repo>/bench/peerbench_kb_standin.py" ...

Only for `embedder: fake` runs (PEERBENCH_EMBEDDER=fake); otherwise it is plain `kb`.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import time
from pathlib import Path


def _install() -> None:
    peerbench = os.environ.get("PEERBENCH_DIR") or str(Path(__file__).resolve().parents[2] / "shared" / "peerbench")
    sys.path.insert(0, peerbench)
    import pb_embed

    from kb_assets.embedding import numpy_bert

    fake = pb_embed.FakeModel()
    stats = {"embed_calls": 0, "texts_embedded": 0, "embed_seconds": 0.0}

    def encode(self, texts):
        t = time.perf_counter()
        out = fake.encode(list(texts))
        stats["embed_calls"] += 1
        stats["texts_embedded"] += len(texts)
        stats["embed_seconds"] += time.perf_counter() - t
        return out

    numpy_bert.OnnxBertEncoder.encode = encode
    numpy_bert.NumpyBertEncoder.encode = encode

    def dump() -> None:
        path = os.environ.get("PEERBENCH_STATS")
        if path and stats["embed_calls"]:
            with open(f"{path}.{os.getpid()}-standin", "w") as fh:
                json.dump(stats, fh)

    atexit.register(dump)


if __name__ == "__main__":
    if os.environ.get("PEERBENCH_EMBEDDER") == "fake":
        _install()
    sys.argv[0] = "kb"        # the console script's name: `kb index` ends as the installed command does
    from kb_assets.cli import main

    sys.exit(main())
