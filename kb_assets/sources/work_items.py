"""Work-item exports: GitHub issues / pull requests (REST `gh api` or `gh issue list --json`) and generic
JSON / JSONL items. One SourceDocument per item, path "<file>#<id>".

Accepted files: a JSON array of items; a JSON object holding the array under items / issues / data /
results / nodes / workItems / tickets / pullRequests; a single item object; JSONL (one item a line,
malformed lines skipped and counted). Arrays are decoded item by item (json raw_decode), so a large
export never becomes one big Python structure.

Fields read (first match wins): id (number, id, key, iid), title (title, summary, name), body (body,
description, text, content), status (state, status, status.name), kind (kind, type, issue_type,
issuetype.name; "pull_request" when the GitHub item is a PR), tags (labels[].name or labels[], tags),
author (user.login, author.login, author, reporter, creator), assignees, created / updated / closed,
url, milestone, comments (a count, or a list of {author | user.login, body, created_at | createdAt}).

Text: "# <title>" + a metadata line (kind, status, tags, author, dates) + "## Body" + one
"## Comment by <author> (<date>)" section per comment. References: "#123" mentions and issue/PR URLs
of the same kind, as "<file>#123" (the path of that item's document).
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from kb_assets.sources.textutil import as_list, normalize_date

_LIST_KEYS = ("items", "issues", "data", "results", "nodes", "workItems", "work_items", "tickets",
              "pullRequests", "pull_requests", "records", "entries")
_REF_RE = re.compile(r"(?<![\w&/#])#(\d{1,7})\b|/(?:issues|pull|pulls)/(\d{1,7})\b")


class WorkItemError(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def _iter_array(text: str, start: int, counter: dict[str, int]) -> Iterator[Any]:
    dec = json.JSONDecoder()
    i = start + 1
    n = len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n:
            counter["malformed"] += 1   # unterminated array
            return
        if text[i] == "]":
            return
        try:
            obj, i = dec.raw_decode(text, i)
        except (ValueError, RecursionError) as exc:
            counter["malformed"] += 1
            raise WorkItemError("malformed", f"invalid JSON at character {i}: {str(exc)[:120]}") from None
        yield obj


def iter_items(text: str, path: str, counter: dict[str, int]) -> Iterator[dict[str, Any]]:
    stripped = text.lstrip()
    lower = path.lower()
    if lower.endswith((".jsonl", ".ndjson")) or (not stripped.startswith(("[", "{")) and "\n{" in text):
        for line in text.split("\n"):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                counter["malformed"] += 1
                continue
            if isinstance(obj, dict):
                yield obj
            else:
                counter["malformed"] += 1
        return
    if stripped.startswith("["):
        for obj in _iter_array(text, text.index("["), counter):
            if isinstance(obj, dict):
                yield obj
            else:
                counter["malformed"] += 1
        return
    if stripped.startswith("{"):
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError) as exc:
            # maybe JSONL without the extension
            if "\n{" in stripped:
                yield from iter_items(text, path + ".jsonl", counter)
                return
            raise WorkItemError("malformed", f"not valid JSON: {str(exc)[:160]}") from None
        if isinstance(obj, dict):
            for k in _LIST_KEYS:
                if isinstance(obj.get(k), list):
                    for it in obj[k]:
                        if isinstance(it, dict):
                            yield it
                        else:
                            counter["malformed"] += 1
                    return
            if isinstance(obj.get("data"), dict):      # GraphQL: {data: {repository: {issues: {nodes}}}}
                found = _find_nodes(obj["data"])
                if found is not None:
                    yield from (it for it in found if isinstance(it, dict))
                    return
            yield obj
        return
    raise WorkItemError("malformed", "not a JSON array, object or JSON lines")


def _find_nodes(d: Any, depth: int = 0) -> list[Any] | None:
    if depth > 5 or not isinstance(d, dict):
        return None
    for k, v in d.items():
        if k in ("nodes", "edges") and isinstance(v, list):
            return [e.get("node", e) if isinstance(e, dict) else e for e in v]
        found = _find_nodes(v, depth + 1)
        if found is not None:
            return found
    return None


def _first(obj: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        v = obj.get(k)
        if v not in (None, "", [], {}):
            return v
    return None


def _person(v: Any) -> str | None:
    if isinstance(v, str):
        return v.strip() or None
    if isinstance(v, dict):
        for k in ("login", "username", "name", "displayName", "display_name", "email"):
            if isinstance(v.get(k), str) and v[k].strip():
                return v[k].strip()
    return None


def _text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, dict):          # e.g. {"text": ...} or rich-text documents
        if isinstance(v.get("text"), str):
            return v["text"]
        return ""
    return ""


def normalize_item(obj: dict[str, Any]) -> dict[str, Any]:
    item: dict[str, Any] = {}
    ident = _first(obj, "number", "id", "key", "iid", "identifier")
    item["id"] = str(ident) if ident is not None else None
    item["title"] = _one_line(_text(_first(obj, "title", "summary", "name")) or "")[:500]
    item["body"] = _text(_first(obj, "body", "description", "text", "content")) or ""
    status = _first(obj, "state", "status")
    if isinstance(status, dict):
        status = status.get("name")
    item["status"] = str(status) if status is not None else None
    kind = _first(obj, "kind", "type", "issue_type", "issueType", "issuetype")
    if isinstance(kind, dict):
        kind = kind.get("name")
    if obj.get("pull_request") or obj.get("isPullRequest") or "mergedAt" in obj or "merged_at" in obj:
        kind = "pull_request"
    elif kind is None and "number" in obj and ("html_url" in obj or "url" in obj or "labels" in obj):
        kind = "issue"
    item["kind"] = str(kind) if kind is not None else None
    labels = obj.get("labels")
    tags: list[str] = []
    if isinstance(labels, dict) and isinstance(labels.get("nodes"), list):
        labels = labels["nodes"]
    if isinstance(labels, list):
        tags += [(lb.get("name") if isinstance(lb, dict) else str(lb)) for lb in labels
                 if (isinstance(lb, dict) and lb.get("name")) or isinstance(lb, str)]
    tags += as_list(obj.get("tags"))
    item["tags"] = [t for i, t in enumerate(tags) if t and t not in tags[:i]][:100]
    item["author"] = _person(_first(obj, "user", "author", "reporter", "creator", "created_by", "opened_by"))
    assignees = obj.get("assignees")
    names = []
    if isinstance(assignees, dict) and isinstance(assignees.get("nodes"), list):
        assignees = assignees["nodes"]
    if isinstance(assignees, list):
        names = [n for a in assignees if (n := _person(a))]
    elif _person(obj.get("assignee")):
        names = [_person(obj.get("assignee"))]
    item["assignees"] = names
    item["created"] = normalize_date(_first(obj, "created_at", "createdAt", "created", "creation_date",
                                            "opened_at"))
    item["updated"] = normalize_date(_first(obj, "updated_at", "updatedAt", "updated", "modified"))
    item["closed"] = normalize_date(_first(obj, "closed_at", "closedAt", "closed", "resolved"))
    url = _first(obj, "html_url", "url", "web_url", "link")
    item["url"] = url if isinstance(url, str) else None
    ms = obj.get("milestone")
    item["milestone"] = ms.get("title") if isinstance(ms, dict) else (ms if isinstance(ms, str) else None)
    comments = obj.get("comments")
    if isinstance(comments, dict) and isinstance(comments.get("nodes"), list):
        comments = comments["nodes"]
    clist: list[dict[str, Any]] = []
    if isinstance(comments, list):
        for c in comments[:5000]:
            if isinstance(c, dict):
                clist.append({
                    "author": _person(_first(c, "author", "user", "creator")) or "unknown",
                    "date": normalize_date(_first(c, "created_at", "createdAt", "created", "date")),
                    "body": _text(_first(c, "body", "text", "content")) or "",
                })
            elif isinstance(c, str):
                clist.append({"author": "unknown", "date": None, "body": c})
        item["comment_count"] = len(clist)
    elif isinstance(comments, int):
        item["comment_count"] = comments
    item["comments"] = clist
    return item


def _one_line(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip()


def render_item(item: dict[str, Any]) -> str:
    title = item["title"] or (f"Item {item['id']}" if item["id"] else "Untitled item")
    facts = []
    for label, key in (("Kind", "kind"), ("Status", "status"), ("Author", "author"), ("Created", "created"),
                       ("Updated", "updated"), ("Closed", "closed"), ("Milestone", "milestone")):
        if item.get(key):
            facts.append(f"{label}: {item[key]}")
    if item.get("tags"):
        facts.append("Tags: " + ", ".join(item["tags"]))
    if item.get("assignees"):
        facts.append("Assignees: " + ", ".join(item["assignees"]))
    parts = [f"# {title}"]
    if facts:
        parts.append(" · ".join(facts))
    body = item["body"].strip()
    parts.append("## Body\n\n" + (body if body else "(no description)"))
    for c in item["comments"]:
        when = f" ({c['date']})" if c.get("date") else ""
        parts.append(f"## Comment by {c['author']}{when}\n\n{c['body'].strip()}")
    return "\n\n".join(parts)


def references(item: dict[str, Any], file_path: str) -> list[str]:
    texts = [item["body"]] + [c["body"] for c in item["comments"]]
    out: list[str] = []
    for t in texts:
        for m in _REF_RE.finditer(t or ""):
            n = m.group(1) or m.group(2)
            ref = f"{file_path}#{n}"
            if n != item["id"] and ref not in out:
                out.append(ref)
    return out[:200]
