"""Peak RSS of indexing one 5,000,000-character Claude Code transcript (target: <= 300 MB).

    /work/venv/bin/python bench/transcript_memory.py [--chars 5000000] [--rounds 2] [--cost 0.002]

A realistic JSONL session is generated (seeded): user prompts, assistant turns with text and tool_use blocks
(Edit with old_string/new_string, Bash, Read, Grep, Write), user turns carrying tool_result blocks (file
contents, command output, a few secret-looking strings for the redactor), with the fields Claude Code writes
(type, message, uuid, parentUuid, timestamp, sessionId, cwd, gitBranch, version, toolUseResult). It is indexed
as a source of kind "transcript" (max_file_bytes raised) with FixedCostEmbedder (fixed cost per text, no
model) in a child process, so the figure measures reading, rendering, redaction, chunking and the database
writes, not the model. Reported: the child's own peak RSS (VmHWM from /proc/self/status), the peak GNU time
reports for it (/usr/bin/time is its tiny parent), and the same for a bare child that only imports
kb_assets.pipeline, kb_assets.sources.readers, kb_assets.chunking and psycopg. ru_maxrss is recorded but not used:
Linux carries the forking parent's peak over exec into it.
"""
from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

OUT = HERE / "out"
SOURCE_KEY = "transcripts"
BASELINE_IMPORTS = "import kb_assets.pipeline, kb_assets.sources.readers, kb_assets.chunking, psycopg"
HWM = ("\nfor _l in open('/proc/self/status'):\n"
       "    if _l.startswith('VmHWM:'): print('HWM', _l.split()[1])")


def hwm_kb() -> int:
    """Peak RSS of this process since exec (VmHWM). ru_maxrss is not used for the figure: Linux carries the
    forking parent's peak over exec into it."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


# --- transcript generator ----------------------------------------------------------------------------------------

def generate_transcript(path: Path, chars: int, seed: int = 11) -> dict:
    """Write a JSONL transcript of at least `chars` characters (lines + newlines); returns counts."""
    import synth_corpus as sc

    vocab = sc.build_vocab(seed)
    rng = random.Random(f"transcript:{seed}")
    w = sc.Writer(vocab, rng)
    session = "5b0c2f1e-8a4d-4e1b-9c7a-%012d" % seed
    t = datetime(2026, 11, 2, 9, 0, 0, tzinfo=timezone.utc)
    parent = None
    n_lines = total = 0
    counts = {"user": 0, "assistant": 0, "tool_result": 0, "tool_use": 0}
    files = [f"/repo/src/{w.ident()}.py" for _ in range(40)]

    def base(kind: str) -> dict:
        nonlocal t, parent
        t += timedelta(seconds=rng.randint(2, 90))
        uid = "%08x-%04x-4%03x-a%03x-%012x" % (rng.getrandbits(32), rng.getrandbits(16), rng.getrandbits(12),
                                                rng.getrandbits(12), rng.getrandbits(48))
        d = {"parentUuid": parent, "isSidechain": False, "userType": "external", "cwd": "/repo",
             "sessionId": session, "version": "2.0.31", "gitBranch": "main", "type": kind, "uuid": uid,
             "timestamp": t.isoformat().replace("+00:00", "Z")}
        parent = uid
        return d

    def code_block(n: int) -> str:
        lines = sc.python_file(w, 0.3).split("\n")
        start = rng.randrange(max(1, len(lines) - n))
        return "\n".join(lines[start:start + n])

    def tool_call() -> tuple[dict, str, dict | None]:
        name = rng.choice(("Edit", "Edit", "Bash", "Read", "Read", "Grep", "Write"))
        f = rng.choice(files)
        tid = "toolu_01" + "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnpqrstuvwxyz0123456789")
                                   for _ in range(22))
        if name == "Edit":
            old = code_block(rng.randint(3, 15))
            new = old.replace(w.ident(), w.ident()) + "\n" + code_block(rng.randint(1, 8))
            inp = {"file_path": f, "old_string": old, "new_string": new}
            result = f"The file {f} has been updated. Here's the result of running `cat -n` on a snippet:\n" + \
                "\n".join(f"{k:>6}\t{ln}" for k, ln in enumerate(new.split("\n"), rng.randint(1, 400)))
            extra = {"filePath": f, "oldString": old, "newString": new, "userModified": False}
        elif name == "Bash":
            cmd = rng.choice(("pytest -q", "git status", "ruff check .", "python -m kb index", "git diff --stat"))
            inp = {"command": cmd, "description": w.sentence(3, 8)[:-1]}
            out_lines = [f"{w.ident()}.py::test_{w.ident()} {rng.choice(('PASSED', 'PASSED', 'FAILED'))}"
                         for _ in range(rng.randint(5, 60))]
            if rng.random() < 0.05:   # something the redactor must catch
                out_lines.append(f"export AWS_ACCESS_KEY_ID=AKIA{''.join(rng.choice('ABCDEFGHIJKLMNOPQRSTUVWXYZ234567') for _ in range(16))}")
                out_lines.append("password=" + "".join(rng.choice("abcdefghijk0123456789") for _ in range(20)))
            result = "\n".join(out_lines)
            extra = {"stdout": result, "stderr": "", "interrupted": False, "isImage": False}
        elif name == "Read":
            inp = {"file_path": f}
            body = code_block(rng.randint(20, 160))
            result = "\n".join(f"{k:>6}\t{ln}" for k, ln in enumerate(body.split("\n"), 1))
            extra = {"type": "text", "file": {"filePath": f, "content": body, "numLines": body.count("\n") + 1}}
        elif name == "Grep":
            inp = {"pattern": w.ident(), "path": "/repo/src", "output_mode": "content"}
            result = "\n".join(f"{rng.choice(files)}:{rng.randint(1, 500)}:    {w.ident()} = {w.ident()}()"
                               for _ in range(rng.randint(3, 40)))
            extra = None
        else:
            body = code_block(rng.randint(20, 80))
            inp = {"file_path": f, "content": body}
            result = f"File created successfully at: {f}"
            extra = {"type": "create", "filePath": f, "content": body}
        return {"type": "tool_use", "id": tid, "name": name, "input": inp}, result, extra

    with path.open("w", encoding="utf-8") as fh:
        def emit(d: dict) -> None:
            nonlocal n_lines, total
            line = json.dumps(d, ensure_ascii=False, separators=(",", ":")) + "\n"
            fh.write(line)
            n_lines += 1
            total += len(line)

        while total < chars:
            u = base("user")
            u["message"] = {"role": "user", "content": "\n\n".join(w.paragraph(1, 4) for _ in range(rng.randint(1, 3)))}
            emit(u)
            counts["user"] += 1
            for _ in range(rng.randint(1, 6)):
                a = base("assistant")
                blocks = [{"type": "text", "text": "\n\n".join(
                    textwrap.fill(w.paragraph(1, 3), 10_000) for _ in range(rng.randint(1, 3)))}]
                tools = [tool_call() for _ in range(rng.randint(0, 2))]
                blocks += [tu for tu, _, _ in tools]
                a["message"] = {"id": "msg_01" + "%022x" % rng.getrandbits(88), "type": "message",
                                "role": "assistant", "model": "claude-sonnet-4-5", "content": blocks,
                                "stop_reason": "tool_use" if tools else "end_turn", "stop_sequence": None,
                                "usage": {"input_tokens": rng.randint(5, 900), "output_tokens": rng.randint(20, 2000),
                                          "cache_read_input_tokens": rng.randint(0, 90_000)}}
                a["requestId"] = "req_" + "%024x" % rng.getrandbits(96)
                emit(a)
                counts["assistant"] += 1
                counts["tool_use"] += len(tools)
                for tu, result, extra in tools:
                    r = base("user")
                    r["message"] = {"role": "user", "content": [
                        {"tool_use_id": tu["id"], "type": "tool_result", "content": result, "is_error": False}]}
                    if extra is not None:
                        r["toolUseResult"] = extra
                    emit(r)
                    counts["tool_result"] += 1
                if total >= chars:
                    break
    return {"path": str(path), "characters": total, "bytes": path.stat().st_size, "lines": n_lines, **counts}


# --- child -------------------------------------------------------------------------------------------------------

def cmd_child(args) -> None:
    t0 = time.perf_counter()
    from kb_assets.config import parse_config
    from kb_assets.embedding import FixedCostEmbedder
    from kb_assets.pipeline import index_sources
    from kb_assets.store.db import connect

    import_s = time.perf_counter() - t0
    rss_imports = hwm_kb()
    cfg = parse_config({"database_url": args.db_url, "sources": [
        {"key": SOURCE_KEY, "kind": "transcript", "root": args.root, "max_file_bytes": args.max_file_bytes}]},
        path="<bench>", base_dir=args.root)
    emb = FixedCostEmbedder(cost_per_text=args.cost)
    conn = connect(args.db_url)
    started = time.perf_counter()
    run = index_sources(cfg, conn, embedder=emb)[SOURCE_KEY]
    wall = time.perf_counter() - started
    doc = conn.execute("SELECT path, length(text), meta->'redactions' FROM documents WHERE source_key = %s"
                       " AND status = 'active'", (SOURCE_KEY,)).fetchall()
    skipped = conn.execute("SELECT path, skip_reason, skip_detail FROM documents WHERE source_key = %s"
                           " AND status = 'skipped'", (SOURCE_KEY,)).fetchall()
    print("RESULT " + json.dumps({
        "wall_s": round(wall, 3), "import_s": round(import_s, 3),
        "documents_s": run.documents.seconds, "chunks_s": run.chunks.seconds, "embeddings_s": run.embeddings.seconds,
        "texts_embedded": emb.texts_embedded, "standin_s": round(emb.texts_embedded * args.cost, 3),
        "chunks_total": run.chunks.chunks_total, "documents": [list(d) for d in doc],
        "skipped": [list(s) for s in skipped], "rss_after_imports_kb": rss_imports,
        "max_rss_kb": hwm_kb(), "ru_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "heavy_modules_loaded": [m for m in ("torch", "sentence_transformers") if m in sys.modules],
    }, default=str))


def wait_child(cmd: list[str]) -> tuple[str, int]:
    """Run cmd under GNU time (a tiny parent, so the peak is not inflated by ours); (stdout, peak RSS KB)."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        p = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", tf.name, *cmd], stdout=subprocess.PIPE, text=True)
        if p.returncode != 0:
            raise SystemExit(f"child failed ({p.returncode}): {p.stdout[-2000:]}")
        return p.stdout, int(tf.read().strip().splitlines()[-1])


def cmd_main(args) -> dict:
    from pipeline_bench import fresh_database, machine_note, remove_workdir, write_results
    from kb_assets.store.db import embedded_url

    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="kbt-", dir="/tmp"))
    root = work / "transcripts"
    root.mkdir(parents=True, exist_ok=True)
    path = root / "5b0c2f1e-session.jsonl"
    t = time.perf_counter()
    info = generate_transcript(path, args.chars, seed=args.seed) if not path.exists() else {"path": str(path)}
    info["generate_s"] = round(time.perf_counter() - t, 2)
    print("transcript:", json.dumps(info))
    server = embedded_url(work)
    results = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "transcript": info,
               "machine": machine_note(), "runs": [], "baseline": []}
    for k in range(args.rounds):
        out, time_kb = wait_child([sys.executable, "-c", BASELINE_IMPORTS + HWM])
        hwm = int(next(ln for ln in out.splitlines() if ln.startswith("HWM ")).split()[1])
        results["baseline"].append({"vmhwm_mb": round(hwm / 1024, 1), "gnu_time_mb": round(time_kb / 1024, 1)})
    print(f"baseline (bare imports) peak RSS: {results['baseline']}")
    for k in range(args.rounds):
        url = fresh_database(server, f"transcript_{k}")
        out, time_kb = wait_child([sys.executable, __file__, "_child", "--root", str(root), "--db-url", url,
                                    "--cost", str(args.cost), "--max-file-bytes", str(args.max_file_bytes)])
        r = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[7:])
        r["max_rss_mb"] = round(r["max_rss_kb"] / 1024, 1)
        r["gnu_time_max_rss_mb"] = round(time_kb / 1024, 1)
        r["ru_maxrss_mb"] = round(r["ru_maxrss_kb"] / 1024, 1)
        r["rss_after_imports_mb"] = round(r["rss_after_imports_kb"] / 1024, 1)
        results["runs"].append(r)
        print(f"round {k + 1}: peak RSS (VmHWM) {r['max_rss_mb']} MB (GNU time {r['gnu_time_max_rss_mb']} MB, "
              f"ru_maxrss {r['ru_maxrss_mb']} MB, after imports "
              f"{r['rss_after_imports_mb']} MB); wall {r['wall_s']} s (documents {r['documents_s']}, chunks "
              f"{r['chunks_s']}, embeddings {r['embeddings_s']} of which stand-in {r['standin_s']}); "
              f"{r['chunks_total']} chunks; documents {r['documents']}; skipped {r['skipped']}")
        if not r["documents"]:
            raise SystemExit("the transcript was not indexed (see skipped)")
    peak = max(max(r["max_rss_mb"], r["gnu_time_max_rss_mb"]) for r in results["runs"])
    results["peak_rss_mb"] = peak
    results["target_le_300_mb"] = peak <= 300
    print(f"peak RSS {peak} MB: target <= 300 MB {'PASS' if peak <= 300 else 'FAIL'}")
    write_results(results, "transcript-memory")
    if not args.workdir:
        remove_workdir(work)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", nargs="?", default="run", choices=("run", "_child"))
    ap.add_argument("--chars", type=int, default=5_000_000)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cost", type=float, default=0.002)
    ap.add_argument("--max-file-bytes", type=int, default=64_000_000)
    ap.add_argument("--workdir")
    ap.add_argument("--root")
    ap.add_argument("--db-url")
    args = ap.parse_args(argv)
    if args.mode == "_child":
        cmd_child(args)
    else:
        cmd_main(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
