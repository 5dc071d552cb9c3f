"""Transcripts: Claude Code and Codex JSONL rendering, hostile lines, bounded memory."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from kb_assets.config import SourceConfig
from kb_assets.sources.discovery import list_source
from kb_assets.sources.readers import read_entry

CWD = "/home/dev/proj"


def claude_lines() -> list[str]:
    sid = "4f35e220-c435-4cf7-b9b9-f40426042847"
    base = {"sessionId": sid, "cwd": CWD, "gitBranch": "fix/cache", "version": "2.0.1", "userType": "external"}
    recs = [
        {"type": "summary", "summary": "Fix the cache stampede on deploy", "leafUuid": "x"},
        {**base, "type": "user", "uuid": "u1", "parentUuid": None, "timestamp": "2026-01-05T10:00:00.000Z",
         "message": {"role": "user", "content": "Why does the cache stampede after each deploy?"}},
        {**base, "type": "user", "uuid": "m1", "isMeta": True, "timestamp": "2026-01-05T10:00:01.000Z",
         "message": {"role": "user", "content": "Caveat: local command output follows"}},
        {**base, "type": "assistant", "uuid": "a1", "timestamp": "2026-01-05T10:00:05.000Z",
         "message": {"id": "msg_1", "role": "assistant", "content": [
             {"type": "thinking", "thinking": "SECRET PLAN: private chain of thought", "signature": "s"},
             {"type": "text", "text": "Let me look at the cache layer."}]}},
        {**base, "type": "assistant", "uuid": "a2", "timestamp": "2026-01-05T10:00:06.000Z",
         "message": {"id": "msg_1", "role": "assistant", "content": [
             {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": f"{CWD}/src/cache.py"}}]}},
        {**base, "type": "user", "uuid": "u2", "timestamp": "2026-01-05T10:00:07.000Z",
         "message": {"role": "user", "content": [
             {"type": "tool_result", "tool_use_id": "toolu_1", "content": "def get(key):\n" + "    pass\n" * 200}]}},
        {**base, "type": "assistant", "uuid": "a3", "timestamp": "2026-01-05T10:01:00.000Z",
         "message": {"id": "msg_2", "role": "assistant", "content": [
             {"type": "tool_use", "id": "toolu_2", "name": "Edit",
              "input": {"file_path": f"{CWD}/src/cache.py", "old_string": "pass", "new_string": "lock()"}},
             {"type": "tool_use", "id": "toolu_3", "name": "Bash",
              "input": {"command": "pytest -q tests/test_cache.py", "description": "run tests"}}]}},
        {**base, "type": "user", "uuid": "u3", "timestamp": "2026-01-05T10:01:30.000Z",
         "message": {"role": "user", "content": [
             {"type": "tool_result", "tool_use_id": "toolu_3", "content": [{"type": "text", "text": "3 passed"}]},
             {"type": "tool_result", "tool_use_id": "toolu_2", "content": "edited"}]}},
        {**base, "type": "assistant", "uuid": "a4", "timestamp": "2026-01-05T10:02:00.000Z",
         "message": {"id": "msg_3", "role": "assistant", "content": [
             {"type": "text", "text": "Fixed: a per-key lock stops the stampede."}]}},
        {**base, "type": "file-history-snapshot", "snapshot": {}},
    ]
    return [json.dumps(r) for r in recs]


def codex_lines() -> list[str]:
    recs = [
        {"timestamp": "2026-02-01T09:00:00.000Z", "type": "session_meta", "payload": {
            "id": "0199-abc", "timestamp": "2026-02-01T09:00:00.000Z", "cwd": CWD, "originator": "codex_cli_rs",
            "cli_version": "0.46.0", "instructions": None, "git": {"commit_hash": "deadbeef" * 5, "branch": "main"}}},
        {"timestamp": "2026-02-01T09:00:00.100Z", "type": "response_item", "payload": {
            "type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "<environment_context>\n  <cwd>/home/dev/proj</cwd>\n</environment_context>"}]}},
        {"timestamp": "2026-02-01T09:00:01.000Z", "type": "response_item", "payload": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Add retries to the client"}]}},
        {"timestamp": "2026-02-01T09:00:01.500Z", "type": "event_msg", "payload": {
            "type": "user_message", "message": "Add retries to the client", "kind": "plain"}},
        {"timestamp": "2026-02-01T09:00:02.000Z", "type": "turn_context", "payload": {"cwd": CWD, "model": "gpt-5"}},
        {"timestamp": "2026-02-01T09:00:03.000Z", "type": "response_item", "payload": {
            "type": "reasoning", "summary": [{"type": "summary_text", "text": "HIDDEN REASONING"}],
            "encrypted_content": "gAAAA"}},
        {"timestamp": "2026-02-01T09:00:04.000Z", "type": "response_item", "payload": {
            "type": "function_call", "name": "shell", "call_id": "call_1",
            "arguments": json.dumps({"command": ["bash", "-lc", "rg -n retry src/"], "workdir": CWD})}},
        {"timestamp": "2026-02-01T09:00:05.000Z", "type": "response_item", "payload": {
            "type": "function_call_output", "call_id": "call_1",
            "output": json.dumps({"output": "src/client.py:10: # no retry yet", "metadata": {"exit_code": 0}})}},
        {"timestamp": "2026-02-01T09:00:06.000Z", "type": "response_item", "payload": {
            "type": "custom_tool_call", "name": "apply_patch", "call_id": "call_2",
            "input": "*** Begin Patch\n*** Update File: src/client.py\n@@\n-x\n+y\n*** Add File: src/retry.py\n"
                     "+def retry(): pass\n*** End Patch"}},
        {"timestamp": "2026-02-01T09:00:07.000Z", "type": "response_item", "payload": {
            "type": "custom_tool_call_output", "call_id": "call_2", "output": "Success. Updated files."}},
        {"timestamp": "2026-02-01T09:00:08.000Z", "type": "response_item", "payload": {
            "type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": "Retries added with exponential backoff."}]}},
    ]
    return [json.dumps(r) for r in recs]


def read_one(root: Path, rel: str, **kw):
    source = SourceConfig(key="t", kind="transcript", root=str(root), **kw)
    entry = next(e for e in list_source(root, source).files if e.path == rel)
    return read_entry(root, entry, source)


def test_claude_transcript_rendering(tmp_path):
    lines = claude_lines()
    hostile = ["{not json", "[1, 2, 3]", "", "\x00\x01garbage", '{"type": "user", "message": ' + "[" * 100000]
    (tmp_path / "s.jsonl").write_text("\n".join(lines[:3] + hostile + lines[3:]) + "\n", encoding="utf-8")
    [doc] = read_one(tmp_path, "s.jsonl")
    m = doc.meta
    assert doc.kind == "transcript"
    assert doc.title == "2026-01-05 — Fix the cache stampede on deploy"
    assert (m["session_id"], m["cwd"], m["branch"]) == ("4f35e220-c435-4cf7-b9b9-f40426042847", CWD, "fix/cache")
    assert (m["started_at"], m["ended_at"]) == ("2026-01-05T10:00:00Z", "2026-01-05T10:02:00Z")
    assert m["malformed_lines"] == 4 and m["format"] == "claude-code"
    assert m["files_touched"] == ["src/cache.py"] and m["files_edited"] == ["src/cache.py"]
    assert m["turns"] == 3 and m["tool_calls"] == 3
    t = doc.text
    assert t.startswith("### user (2026-01-05T10:00:00Z)\n\nWhy does the cache stampede")
    assert "### assistant (2026-01-05T10:00:05Z)\n\nLet me look at the cache layer." in t
    assert "### tool: Read src/cache.py" not in t and f"### tool: Read {CWD}/src/cache.py" in t
    assert "### tool: Bash pytest -q tests/test_cache.py\n\n3 passed" in t
    assert "### tool: Edit" in t and "\n\nedited" in t
    assert "chars truncated]" in t                           # the 1,800-char Read output was cut
    assert "SECRET PLAN" not in t and "Caveat" not in t      # thinking and meta messages dropped
    assert t.rstrip().endswith("Fixed: a per-key lock stops the stampede.")


def test_codex_rollout_rendering(tmp_path):
    (tmp_path / "rollout-2026-02-01.jsonl").write_text("\n".join(codex_lines()) + "\n", encoding="utf-8")
    [doc] = read_one(tmp_path, "rollout-2026-02-01.jsonl")
    m = doc.meta
    assert (m["format"], m["session_id"], m["branch"], m["commit"]) == ("codex", "0199-abc", "main", "deadbeef" * 5)
    assert m["files_touched"] == ["src/client.py", "src/retry.py"] == m["files_edited"]
    assert doc.title == "2026-02-01 — Add retries to the client"
    t = doc.text
    assert "environment_context" not in t and "HIDDEN REASONING" not in t
    assert t.count("Add retries to the client") == 1         # event_msg duplicates are ignored
    assert "### tool: shell rg -n retry src/\n\nsrc/client.py:10: # no retry yet" in t
    assert "### tool: apply_patch src/client.py src/retry.py\n\nSuccess. Updated files." in t
    assert "### assistant (2026-02-01T09:00:08Z)\n\nRetries added with exponential backoff." in t


def test_oversized_line_is_skipped_and_counted(tmp_path):
    big = json.dumps({"type": "user", "message": {"role": "user", "content": "y" * (6 * 1024 * 1024)}})
    (tmp_path / "s.jsonl").write_text("\n".join(claude_lines()[:2] + [big] + claude_lines()[2:]) + "\n")
    [doc] = read_one(tmp_path, "s.jsonl")
    assert doc.meta["oversized_lines"] == 1 and "yyyy" not in doc.text
    assert "Fixed: a per-key lock" in doc.text


def test_unusable_transcripts(tmp_path):
    (tmp_path / "junk.jsonl").write_text("not json\nstill not\n")
    (tmp_path / "other.jsonl").write_text('{"hello": 1}\n{"world": 2}\n')
    (tmp_path / "bin.jsonl").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 50)
    assert read_one(tmp_path, "junk.jsonl").reason == "malformed"
    assert read_one(tmp_path, "other.jsonl").reason == "too-small"
    assert read_one(tmp_path, "bin.jsonl").reason == "binary"


def make_big_transcript(path: Path, target_chars: int = 5_000_000) -> int:
    """A realistic Claude Code transcript of target_chars characters (large tool outputs, thinking)."""
    written = 0
    i = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target_chars:
            ts = f"2026-01-05T{10 + i // 3600 % 10:02d}:{i // 60 % 60:02d}:{i % 60:02d}.000Z"
            recs = [
                {"type": "user", "sessionId": "big", "cwd": CWD, "timestamp": ts,
                 "message": {"role": "user", "content": f"Step {i}: please check module_{i}.py for the bug ñ✓"}},
                {"type": "assistant", "sessionId": "big", "timestamp": ts, "message": {
                    "id": f"m{i}", "role": "assistant", "content": [
                        {"type": "thinking", "thinking": "hmm " * 500},
                        {"type": "text", "text": f"Looking at module_{i}.py now. " * 5},
                        {"type": "tool_use", "id": f"t{i}", "name": "Read",
                         "input": {"file_path": f"{CWD}/pkg/module_{i % 50}.py"}}]}},
                {"type": "user", "sessionId": "big", "timestamp": ts, "message": {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": f"t{i}",
                     "content": ("    x = compute(value)  # line of code\n" * 400)}]}},
            ]
            for r in recs:
                line = json.dumps(r, ensure_ascii=False)
                f.write(line + "\n")
                written += len(line) + 1
            i += 1
    return written


def test_five_million_char_transcript_peak_rss(tmp_path):
    path = tmp_path / "big.jsonl"
    n = make_big_transcript(path)
    assert n >= 5_000_000
    script = textwrap.dedent(f"""
        import json, time
        from pathlib import Path

        def hwm_kb():
            # VmHWM starts afresh at exec; ru_maxrss would carry over the (large) forking test process's peak.
            for line in open("/proc/self/status"):
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])

        from kb_assets.config import SourceConfig
        from kb_assets.sources.discovery import list_source
        from kb_assets.sources.readers import read_entry
        root = Path({str(tmp_path)!r})
        src = SourceConfig(key="t", kind="transcript", root=str(root))
        entry = [e for e in list_source(root, src).files if e.path == "big.jsonl"][0]
        base = hwm_kb()
        t = time.process_time()
        [doc] = read_entry(root, entry, src)
        cpu = time.process_time() - t
        peak = hwm_kb()
        print(json.dumps({{"base_mb": base / 1024, "peak_mb": peak / 1024, "cpu_s": cpu,
                          "text_chars": len(doc.text), "turns": doc.meta["turns"]}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\n5M-char transcript ({n:,} chars): peak RSS {res['peak_mb']:.0f} MB "
          f"(after imports {res['base_mb']:.0f} MB), {res['cpu_s']:.1f} s CPU, rendered {res['text_chars']:,} chars")
    assert res["peak_mb"] < 300
    assert res["peak_mb"] - res["base_mb"] < 120        # reading adds little beyond the interpreter + imports
    assert res["turns"] > 500 and res["text_chars"] < n / 2
