"""Agent transcripts: Claude Code session JSONL and Codex CLI rollout JSONL, read as a stream.

Shapes (checked against public descriptions of both formats):
- Claude Code: one object per line, {type: user|assistant|summary|system|file-history-snapshot|...,
  message: {role, content: str | [{type: text|tool_use|tool_result|thinking|image, ...}]}, timestamp,
  sessionId, cwd, gitBranch, uuid, isMeta, isSidechain}. An assistant message is often split over several
  lines (one per content block) sharing message.id: their text is merged under one heading.
- Codex CLI: {timestamp, type: session_meta|response_item|event_msg|turn_context|compacted, payload}.
  response_item payloads: message {role, content: [{type: input_text|output_text, text}]}, function_call
  {name, arguments (JSON text), call_id}, function_call_output {call_id, output}, custom_tool_call {name,
  input}, custom_tool_call_output, local_shell_call {action: {command: [...]}}, reasoning (dropped),
  web_search_call. event_msg lines repeat response items for the UI and are ignored. Older rollouts have
  no envelope (the payload objects are the lines; the first line carries id/timestamp/instructions).

Rendering (the document text): "### user (<timestamp>)" / "### assistant (<timestamp>)" headings with the
message text; "### tool: <name> <salient args>" for a tool call (file_path, command, pattern, url, query...,
cut to 200 chars) followed by its output, cut to TOOL_OUTPUT_CHARS + "… [N chars truncated]"; thinking and
reasoning are dropped; Codex boilerplate user messages (<environment_context>, <user_instructions>,
AGENTS.md instructions) are dropped; messages longer than MESSAGE_CHARS are cut.

Redaction: cuts are extended to the end of the token they fall in (at most CUT_SLACK more characters) so
that no secret is cut in half, then the whole rendered text and the meta strings are redacted once
(one pass over a few MB is faster than thousands of small passes), before anything leaves this module.

Bounded memory: the file is read line by line (never json.load of the whole file); a line over
MAX_LINE_BYTES is skipped and counted (meta['oversized_lines']) without being held; only the rendered
(already truncated) text is kept.
"""
from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from typing import IO, Any

from kb_assets.sources.redaction import merge_counts, redact

MAX_LINE_BYTES = 5 * 1024 * 1024
TOOL_OUTPUT_CHARS = 400
TOOL_ARG_CHARS = 200
MESSAGE_CHARS = 20_000
CUT_SLACK = 2_000

_SALIENT_KEYS = ("file_path", "notebook_path", "path", "command", "cmd", "pattern", "url", "query",
                 "description", "prompt", "skill", "subagent_type", "old_string", "glob")
_READ_TOOLS = {"Read", "NotebookRead", "read_file", "view", "open_file"}
_EDIT_TOOLS = {"Edit", "Write", "MultiEdit", "NotebookEdit", "write_file", "edit_file", "str_replace_editor",
               "create_file", "apply_patch"}
_PATCH_FILE_RE = re.compile(r"^\*\*\* (?:Add|Update|Delete) File: (.+?)\s*$|^\*\*\* Move to: (.+?)\s*$", re.M)
_CODEX_BOILERPLATE = ("<environment_context>", "<user_instructions>", "# AGENTS.md instructions",
                      "<permissions instructions>", "<user_shell_command>", "<turn_aborted>")


def iter_capped_lines(stream: IO[bytes], cap: int = MAX_LINE_BYTES) -> Iterator[bytes | None]:
    """Lines of a binary stream; None for a line longer than cap (drained in pieces, never held)."""
    while True:
        line = stream.readline(cap + 1)
        if not line:
            return
        if len(line) > cap and not line.endswith(b"\n"):
            while True:
                more = stream.readline(1 << 20)
                if not more or more.endswith(b"\n"):
                    break
            yield None
            continue
        yield line


_TOKEN_TAIL = re.compile(r"\S*")


def cut(text: str, limit: int) -> str:
    """text cut near limit characters, never inside a token, with a marker saying how much was dropped."""
    if len(text) <= limit:
        return text
    end = limit
    m = _TOKEN_TAIL.match(text, end, min(len(text), end + CUT_SLACK))
    if m:
        end = m.end()
    if end >= len(text):
        return text
    return text[:end] + f" … [{len(text) - end:,} chars truncated]"


def _one_line(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip()


def _ts(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        d = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if d.tzinfo is None:
        d = d.replace(tzinfo=dt.timezone.utc)
    return d.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Render:
    def __init__(self) -> None:
        self.parts: list[str] = []
        self.meta: dict[str, Any] = {}
        self.session_id: str | None = None
        self.cwd: str | None = None
        self.branch: str | None = None
        self.commit: str | None = None
        self.started: str | None = None
        self.ended: str | None = None
        self.turns = 0
        self.tool_calls = 0
        self.malformed = 0
        self.oversized = 0
        self.records = 0
        self.summaries: list[str] = []
        self.first_prompt: str | None = None
        self.read: list[str] = []
        self.edited: list[str] = []
        self.tool_names: dict[str, str] = {}      # call id -> tool name
        self.tool_part: dict[str, int] = {}       # call id -> index of its part
        self.last_text: tuple[str, str] | None = None   # (role, message id) of the last text part
        self.formats: set[str] = set()

    # -- bookkeeping
    def seen_time(self, ts: str | None) -> None:
        if ts:
            if self.started is None or ts < self.started:
                self.started = ts
            if self.ended is None or ts > self.ended:
                self.ended = ts

    def add_text(self, role: str, text: str, ts: str | None, msg_id: str | None = None) -> None:
        text = text.strip()
        if not text:
            return
        text = cut(text, MESSAGE_CHARS)
        if role == "user" and self.first_prompt is None:
            self.first_prompt = _one_line(text)[:200]
        key = (role, msg_id) if msg_id else None
        if key is not None and key == self.last_text and self.parts:
            self.parts[-1] += "\n\n" + text
            return
        self.turns += 1
        label = role + (f" ({ts})" if ts else "")
        self.parts.append(f"### {label}\n\n{text}")
        self.last_text = key

    def add_tool(self, name: str, args: dict[str, Any] | str | None, call_id: str | None) -> None:
        self.tool_calls += 1
        self.last_text = None
        salient = _salient(name, args)
        head = f"### tool: {name}" + (f" {salient}" if salient else "")
        if call_id:
            self.tool_names[call_id] = name
            self.tool_part[call_id] = len(self.parts)
        self.parts.append(head)
        for path in _touched(name, args):
            self._touch(path, edited=name in _EDIT_TOOLS or name == "apply_patch")

    def add_result(self, call_id: str | None, output: str, is_error: bool = False) -> None:
        self.last_text = None
        output = output.strip()
        if not output:
            return
        body = cut(output, TOOL_OUTPUT_CHARS)
        if is_error:
            body = "(error) " + body
        idx = self.tool_part.pop(call_id, None) if call_id else None
        if idx is not None and idx < len(self.parts):
            self.parts[idx] += "\n\n" + body
        else:
            name = self.tool_names.get(call_id or "", "tool")
            self.parts.append(f"### tool result: {name}\n\n{body}")

    def _touch(self, path: str, edited: bool) -> None:
        if not path or len(path) > 1000:
            return
        p = path.strip()
        if self.cwd and p.startswith(self.cwd.rstrip("/") + "/"):
            p = p[len(self.cwd.rstrip("/")) + 1:]
        target = self.edited if edited else self.read
        if p not in target and len(target) < 2000:
            target.append(p)


def _salient(name: str, args: dict[str, Any] | str | None) -> str:
    if isinstance(args, str):
        if name == "apply_patch":
            files = [a or b for a, b in _PATCH_FILE_RE.findall(args)]
            return cut(" ".join(files), TOOL_ARG_CHARS) if files else ""
        return cut(_one_line(args), TOOL_ARG_CHARS)
    if not isinstance(args, dict):
        return ""
    vals: list[str] = []
    for k in _SALIENT_KEYS:
        v = args.get(k)
        if v is None or v == "":
            continue
        if isinstance(v, list):
            v = _shell_join(v)
        vals.append(_one_line(str(v)))
        if len(vals) == 2 or k in ("command", "cmd"):
            break
    if not vals and name == "apply_patch" and isinstance(args.get("input"), str):
        return _salient(name, args["input"])
    return cut(" ".join(vals), TOOL_ARG_CHARS)


def _shell_join(cmd: list[Any]) -> str:
    words = [str(w) for w in cmd]
    if len(words) >= 3 and words[0] in ("bash", "sh", "zsh") and words[1] in ("-lc", "-c"):
        return " ".join(words[2:])
    return " ".join(words)


def _touched(name: str, args: dict[str, Any] | str | None) -> list[str]:
    out: list[str] = []
    if isinstance(args, dict):
        for k in ("file_path", "notebook_path"):
            if isinstance(args.get(k), str):
                out.append(args[k])
        if name in _READ_TOOLS | _EDIT_TOOLS and isinstance(args.get("path"), str):
            out.append(args["path"])
        patch = args.get("input") if name == "apply_patch" else None
        cmd = args.get("command")
        if isinstance(cmd, list):
            cmd = _shell_join(cmd)
        if isinstance(cmd, str) and "*** Begin Patch" in cmd:
            patch = cmd
        if isinstance(patch, str):
            out += [a or b for a, b in _PATCH_FILE_RE.findall(patch)]
    elif isinstance(args, str) and "*** Begin Patch" in args:
        out += [a or b for a, b in _PATCH_FILE_RE.findall(args)]
    return out


def _block_text(content: Any) -> str:
    """Text of a tool_result content (str, or a list of text/image blocks)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        bits = []
        for b in content:
            if isinstance(b, dict):
                if b.get("type") == "text" and isinstance(b.get("text"), str):
                    bits.append(b["text"])
                elif b.get("type") == "image":
                    bits.append("[image]")
            elif isinstance(b, str):
                bits.append(b)
        return "\n".join(bits)
    if isinstance(content, dict) and isinstance(content.get("text"), str):
        return content["text"]
    return ""


# --- Claude Code ------------------------------------------------------------------------------------

def _claude(r: _Render, obj: dict[str, Any]) -> bool:
    typ = obj.get("type")
    if typ == "summary":
        s = obj.get("summary")
        if isinstance(s, str) and s.strip() and len(r.summaries) < 5:
            r.summaries.append(_one_line(s)[:300])
        return True
    if typ not in ("user", "assistant"):
        return typ in ("system", "file-history-snapshot", "queue-operation", "progress", "result")
    r.formats.add("claude-code")
    r.session_id = r.session_id or (obj.get("sessionId") if isinstance(obj.get("sessionId"), str) else None)
    if isinstance(obj.get("cwd"), str) and not r.cwd:
        r.cwd = obj["cwd"]
    if isinstance(obj.get("gitBranch"), str) and obj["gitBranch"] and not r.branch:
        r.branch = obj["gitBranch"]
    ts = _ts(obj.get("timestamp"))
    r.seen_time(ts)
    if obj.get("isMeta"):
        return True
    msg = obj.get("message") if isinstance(obj.get("message"), dict) else {}
    role = msg.get("role") if msg.get("role") in ("user", "assistant") else typ
    if obj.get("isSidechain"):
        role = f"{role} (subagent)"
    content = msg.get("content")
    msg_id = msg.get("id") if isinstance(msg.get("id"), str) else None
    if isinstance(content, str):
        r.add_text(role, content, ts, msg_id)
        return True
    if not isinstance(content, list):
        return True
    for block in content:
        if not isinstance(block, dict):
            continue
        bt = block.get("type")
        if bt == "text" and isinstance(block.get("text"), str):
            r.add_text(role, block["text"], ts, msg_id)
        elif bt == "tool_use":
            name = str(block.get("name") or "tool")
            r.add_tool(name, block.get("input"), block.get("id") if isinstance(block.get("id"), str) else None)
        elif bt == "tool_result":
            cid = block.get("tool_use_id") if isinstance(block.get("tool_use_id"), str) else None
            r.add_result(cid, _block_text(block.get("content")), bool(block.get("is_error")))
        elif bt == "image":
            r.add_text(role, "[image]", ts, msg_id)
        # thinking / redacted_thinking: dropped
    return True


# --- Codex CLI --------------------------------------------------------------------------------------

_CODEX_ITEMS = {"message", "function_call", "function_call_output", "custom_tool_call",
                "custom_tool_call_output", "local_shell_call", "reasoning", "web_search_call"}


def _codex(r: _Render, obj: dict[str, Any]) -> bool:
    typ = obj.get("type")
    payload = obj.get("payload")
    ts = _ts(obj.get("timestamp"))
    if typ == "session_meta" and isinstance(payload, dict):
        r.formats.add("codex")
        r.session_id = r.session_id or (str(payload.get("id")) if payload.get("id") else None)
        if isinstance(payload.get("cwd"), str):
            r.cwd = r.cwd or payload["cwd"]
        git = payload.get("git") if isinstance(payload.get("git"), dict) else {}
        if isinstance(git.get("branch"), str) and git["branch"]:
            r.branch = r.branch or git["branch"]
        c = git.get("commit_hash") or git.get("commit")
        if isinstance(c, str) and c:
            r.commit = r.commit or c
        r.seen_time(_ts(payload.get("timestamp")) or ts)
        return True
    if typ == "turn_context" and isinstance(payload, dict):
        if isinstance(payload.get("cwd"), str) and not r.cwd:
            r.cwd = payload["cwd"]
        return True
    if typ in ("event_msg", "compacted"):
        r.seen_time(ts)
        return True
    if typ == "response_item" and isinstance(payload, dict):
        item = payload
    elif typ in _CODEX_ITEMS and "payload" not in obj:
        item = obj                      # older rollouts: the item is the line
    elif "instructions" in obj and "id" in obj and "type" not in obj:
        r.formats.add("codex")
        r.session_id = r.session_id or str(obj.get("id"))
        r.seen_time(_ts(obj.get("timestamp")))
        return True
    else:
        return False
    r.formats.add("codex")
    r.seen_time(ts)
    it = item.get("type")
    if it == "message":
        role = item.get("role")
        if role not in ("user", "assistant"):
            return True
        text = _block_text_codex(item.get("content"))
        if role == "user" and text.lstrip().startswith(_CODEX_BOILERPLATE):
            return True
        r.add_text(role, text, ts, None)
    elif it == "function_call":
        name = str(item.get("name") or "tool")
        raw = item.get("arguments")
        args: Any = raw
        if isinstance(raw, str):
            try:
                args = json.loads(raw)
            except ValueError:
                args = raw
        r.add_tool(name, args, item.get("call_id") if isinstance(item.get("call_id"), str) else None)
    elif it == "custom_tool_call":
        name = str(item.get("name") or "tool")
        r.add_tool(name, item.get("input") if isinstance(item.get("input"), str) else None,
                   item.get("call_id") if isinstance(item.get("call_id"), str) else None)
    elif it == "local_shell_call":
        action = item.get("action") if isinstance(item.get("action"), dict) else {}
        r.add_tool("shell", {"command": action.get("command")},
                   item.get("call_id") if isinstance(item.get("call_id"), str) else None)
    elif it in ("function_call_output", "custom_tool_call_output"):
        out = item.get("output")
        text = ""
        if isinstance(out, str):
            text = out
            if out.startswith("{"):
                try:
                    o = json.loads(out)
                    if isinstance(o, dict) and isinstance(o.get("output"), str):
                        text = o["output"]
                except ValueError:
                    pass
        elif isinstance(out, dict):
            text = out.get("content") if isinstance(out.get("content"), str) else _block_text(out.get("content"))
        r.add_result(item.get("call_id") if isinstance(item.get("call_id"), str) else None, text or "")
    elif it == "web_search_call":
        action = item.get("action") if isinstance(item.get("action"), dict) else {}
        r.add_tool("web_search", {"query": action.get("query")}, None)
    # reasoning: dropped
    return True


def _block_text_codex(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b.get("text", "") for b in content
                         if isinstance(b, dict) and isinstance(b.get("text"), str))
    return ""


# --- entry point ------------------------------------------------------------------------------------

class TranscriptError(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def read_transcript(stream: IO[bytes], path: str) -> tuple[str, str, dict[str, Any]]:
    """(title, text, meta) of a transcript stream. Raises TranscriptError when nothing is recognisable."""
    r = _Render()
    unknown = 0
    for raw in iter_capped_lines(stream):
        if raw is None:
            r.oversized += 1
            continue
        s = raw.strip()
        if not s:
            continue
        try:
            obj = json.loads(s)
        except (ValueError, UnicodeDecodeError, RecursionError):
            r.malformed += 1
            continue
        if not isinstance(obj, dict):
            r.malformed += 1
            continue
        r.records += 1
        if ("payload" in obj or obj.get("type") in _CODEX_ITEMS or "instructions" in obj) and _codex(r, obj):
            continue
        if not _claude(r, obj):
            unknown += 1
    if r.turns == 0 and r.tool_calls == 0:
        if r.records == 0:
            raise TranscriptError("malformed", f"no JSON records ({r.malformed} malformed lines, "
                                               f"{r.oversized} over {MAX_LINE_BYTES // (1024 * 1024)} MB)")
        raise TranscriptError("too-small", f"no user or assistant turns in {r.records} records")
    text, counts = redact("\n\n".join(r.parts))
    r.parts = []
    meta: dict[str, Any] = {
        "format": "+".join(sorted(r.formats)) or "unknown",
        "session_id": r.session_id, "cwd": r.cwd, "branch": r.branch, "commit": r.commit,
        "started_at": r.started, "ended_at": r.ended,
        "date": r.started[:10] if r.started else None,
        "turns": r.turns, "tool_calls": r.tool_calls,
        "files_touched": sorted(set(r.read) | set(r.edited)), "files_edited": r.edited,
        "malformed_lines": r.malformed, "oversized_lines": r.oversized, "unknown_records": unknown,
    }
    if r.summaries:
        meta["summary"] = r.summaries[0]
    title_core = r.summaries[0] if r.summaries else (r.first_prompt or f"session {r.session_id or path}")
    title = (f"{meta['date']} — " if meta["date"] else "") + cut(title_core, 120)
    # Redact the strings that are stored beside the text.
    title, c = redact(title)
    merge_counts(counts, c)
    for key in ("summary", "cwd", "branch"):
        if isinstance(meta.get(key), str):
            meta[key], c = redact(meta[key])
            merge_counts(counts, c)
    for key in ("files_touched", "files_edited"):
        joined, c = redact("\n".join(meta[key]))
        if c:
            meta[key] = joined.split("\n")
            merge_counts(counts, c)
    meta = {k: v for k, v in meta.items() if v not in (None, "")}
    meta["redactions"] = counts
    return title, text, meta
