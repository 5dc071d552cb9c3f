"""The query encoder alone, variants asked in turn in one process (the same load for all): CPU and wall per
forward pass at 32 / 128 / 256 word pieces.

    python bench/serve_encoder_bench.py              # onnxruntime graphs: fused Attention vs the plain opset one
    python bench/serve_encoder_bench.py --torch      # plus sentence-transformers (torch, 1 thread) and numpy

Graph variants: `fused` (what kb serve runs, numpy_bert.build_onnx_graph()) and `plain`
(fused_attention=False: MatMul / Softmax / Transpose, the graph before), each with 1 and 2 intra-op threads,
spinning off as in OnnxBertEncoder. The hidden states of each variant are compared with the first's (max |diff|).
CPU time (process_time) is the figure a busy machine inflates least; wall min is the nearest to a quiet core.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def _session(graph: bytes, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    return ort.InferenceSession(graph, opts, providers=["CPUExecutionProvider"])


def main() -> None:
    import numpy as np

    from kb_assets.embedding import numpy_bert
    from kb_assets.embedding.local import packaged_model_dir

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--torch", action="store_true", help="also time sentence-transformers and numpy on texts")
    args = ap.parse_args()
    path = packaged_model_dir()
    graphs = {name: numpy_bert.build_onnx_graph(path, fused_attention=name == "fused") for name in ("fused", "plain")}
    variants = {f"{g}, {t} thread{'s' * (t > 1)}": (_session(graphs[g], t), g) for g in graphs for t in (1, 2)}
    rng = np.random.default_rng(0)
    for seq in (32, 128, 256):
        feeds = {"word_embeds": rng.standard_normal((1, seq, 384)).astype(np.float32),
                 "position_ids": np.arange(seq, dtype=np.int64)[None], "token_type_ids": np.zeros((1, seq), np.int64)}
        extra = {"fused": {"attention_mask": np.ones((1, seq), np.int32)},
                 "plain": {"attn_bias": np.zeros((1, 1, 1, seq), np.float32)}}
        first, times = None, {name: [] for name in variants}
        for name, (s, g) in variants.items():
            out = s.run(["hidden"], {**feeds, **extra[g]})[0]
            first = out if first is None else first
            print(f"{seq} pieces, {name}: max |diff| vs the first {float(np.abs(out - first).max()):.1e}")
        for k in range(args.reps):
            for name in (list(variants) if k % 2 else list(variants)[::-1]):
                s, g = variants[name]
                c0, w0 = time.process_time(), time.perf_counter()
                s.run(["hidden"], {**feeds, **extra[g]})
                times[name].append(((time.perf_counter() - w0) * 1000, (time.process_time() - c0) * 1000))
        for name, v in times.items():
            wall, cpu = sorted(x[0] for x in v), sorted(x[1] for x in v)
            print(f"{seq:3d} pieces  {name:18s} cpu p50 {cpu[len(cpu) // 2]:6.1f} ms  wall p50 {wall[len(wall) // 2]:6.1f}"
                  f"  min {wall[0]:6.1f} ms")
        print(f"load average {os.getloadavg()[0]:.1f}", flush=True)
    if args.torch:
        _torch_beside(path, args.reps)


def _torch_beside(path, reps: int) -> None:
    """sentence-transformers (torch, 1 thread), the onnxruntime encoder and the numpy one, whole encode() calls."""
    import numpy as np
    import torch

    from kb_assets.embedding import local as local_mod
    from kb_assets.embedding import numpy_bert

    torch.set_num_threads(1)
    model = local_mod.load_model(path)
    onnx, plain = numpy_bert.OnnxBertEncoder(path, threads=1), numpy_bert.NumpyBertEncoder(path)
    words = "the retry policy honours retry-after and backs off with jitter when the upstream service answers slowly"
    texts = {"short": "how do we restart the celery workers after change 7",
             "English paragraph, 85 words": " ".join((words.split() * 8)[:85]),
             "bench paragraph (synthetic w-words)": " ".join(f"w{int(x)}" for x in np.random.default_rng(3)
                                                             .integers(1, 30000, 100))}
    fns = {"torch": lambda t: model.encode([t], normalize_embeddings=True, show_progress_bar=False),
           "onnxruntime": lambda t: onnx.encode([t]), "numpy": lambda t: plain.encode([t])}
    for label, text in texts.items():
        cpu = {k: [] for k in fns}
        for f in fns.values():
            f(text)
        for r in range(reps):
            for k in (list(fns) if r % 2 else list(fns)[::-1]):
                c0 = time.process_time()
                fns[k](text)
                cpu[k].append((time.process_time() - c0) * 1000)
        cos = float(np.dot(fns["torch"](text)[0], fns["onnxruntime"](text)[0]))
        print(f"{label} ({onnx._tokens([text])[0].shape[1]} pieces): cpu p50 ms " +
              ", ".join(f"{k} {sorted(v)[len(v) // 2]:.1f}" for k, v in cpu.items()) +
              f"; cosine torch/onnxruntime {cos:.6f}; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
