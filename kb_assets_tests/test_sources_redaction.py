"""Redaction: planted secrets of each family never reach the readers' output; normal text does.

Secret-shaped values are generated at run time (random, fake) so no credential-looking literal sits
in the repository.
"""
from __future__ import annotations

import json
import random
import string
import tarfile
import time
from pathlib import Path

import pytest

from kb_assets.config import SourceConfig
from kb_assets.sources.discovery import list_source
from kb_assets.sources.readers import read_entry
from kb_assets.sources.redaction import find_secrets, redact

RND = random.Random(20261130)
AL = string.ascii_letters + string.digits


def r(n: int, alphabet: str = AL) -> str:
    return "".join(RND.choice(alphabet) for _ in range(n))


def planted() -> dict[str, tuple[str, str, str]]:
    """family -> (text containing it, the secret value, expected placeholder type)."""
    aws_id = "AKIA" + r(16, string.ascii_uppercase + string.digits)
    aws_secret = r(40, AL + "/+")
    gh = "ghp_" + r(36)
    ghf = "github_pat_11" + r(20, string.ascii_uppercase + string.digits) + "_" + r(59)
    gl = "glpat-" + r(20)
    slack = f"xoxb-{r(12, string.digits)}-{r(13, string.digits)}-{r(24)}"
    stripe = "sk_live_" + r(24)
    openai = "sk-proj-" + r(64, AL + "_-")
    anthropic = "sk-ant-api03-" + r(93, AL + "_-") + "AA"
    google = "AIza" + r(35, AL + "_-")
    voyage = "pa-" + r(43, AL + "_-")
    jwt = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0Ijo"
           "xNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
    pg_pass = r(18)
    foo_secret = r(32, AL + "-_")
    svc_token = r(32, AL + "-_")
    db_pass = r(14) + "7"
    bearer = r(40)
    key_body = "\n".join(r(64, AL + "+/") for _ in range(8))
    private_key = f"-----BEGIN RSA PRIVATE KEY-----\n{key_body}\n-----END RSA PRIVATE KEY-----"
    return {
        "aws-access-key": (f"aws_access_key_id = {aws_id}", aws_id, "aws-access-key"),
        "aws-secret-key": (f'aws_secret_access_key = "{aws_secret}"', aws_secret, "aws-secret-key"),
        "github": (f"token {gh} here", gh, "github-token"),
        "github-fine-grained": (f"GH_PAT={ghf}", ghf, "github-token"),
        "gitlab": (f"use {gl} for CI", gl, "gitlab-token"),
        "slack": (f"bot {slack}", slack, "slack-token"),
        "stripe": (f"stripe key {stripe}", stripe, "stripe-key"),
        "openai": (f"OPENAI_API_KEY={openai}", openai, "openai-key"),
        "anthropic": (f"ANTHROPIC_API_KEY: {anthropic}", anthropic, "anthropic-key"),
        "google": (f"maps key {google}", google, "google-api-key"),
        "voyage": (f"VOYAGE_API_KEY={voyage}", voyage, "voyage-key"),
        "jwt": (f"Authorization: Bearer {jwt}", jwt, "jwt"),
        "bearer": (f"curl -H 'Authorization: Bearer {bearer}' https://api.example.com/v1", bearer, "bearer-token"),
        "password-in-url": (f"DATABASE_URL=postgres://app:{pg_pass}@db.internal:5432/app", pg_pass, "password-in-url"),
        "foo-secret": (f'FOO_SECRET = "{foo_secret}"', foo_secret, "generic-secret"),
        "service-token": (f"export SERVICE_TOKEN={svc_token}", svc_token, "generic-secret"),
        "db-password": (f"DB_PASSWORD={db_pass}", db_pass, "generic-secret"),
        "private-key": (f"key:\n{private_key}\nend", key_body.split("\n")[3], "private-key"),
    }


@pytest.mark.parametrize("family", sorted(planted()))
def test_each_family_is_redacted(family):
    text, value, slug = planted()[family]
    out, counts = redact("Intro words stay.\n" + text + "\nOutro words stay.")
    assert value not in out
    assert f"[REDACTED:{slug}]" in out and counts.get(slug, 0) >= 1
    assert out.startswith("Intro words stay.\n") and out.endswith("\nOutro words stay.")


def test_no_false_positives_on_ordinary_text():
    text = ("The password policy requires 12 characters. Token counts: input_tokens: 12000.\n"
            "Author: Charles-François Natali\nsecret sauce = good docs\n"
            "token = aws_eks_cluster.cluster.token\nuuid = '123e4567-e89b-12d3-a456-426614174000'\n"
            "commit 9fceb02d0ae598e95dc970b74767f19372d61af8 fixed it; see https://example.com/a/b?x=1\n"
            "password = os.environ['DB_PASSWORD']\napi_key = get_key()\nsk-learn is a library\n")
    out, counts = redact(text)
    assert counts == {} and out == text


def _secret_values() -> list[str]:
    return [v for _t, v, _s in planted().values()]


def test_readers_output_has_no_secret_values(tmp_path):
    fams = planted()
    all_text = "\n".join(t for t, _v, _s in fams.values())
    values = [v for _t, v, _s in fams.values()]
    # README with every family and normal prose
    (tmp_path / "README.md").write_text("# Payments service\n\nHow to run the payments service locally.\n\n"
                                        "```\n" + all_text + "\n```\n\nAsk the platform team for access.\n")
    # code file and an env file
    (tmp_path / "settings.py").write_text("import os\n\n" + "\n".join(
        f"# {name}\nVALUE_{i} = {json.dumps(t)}" for i, (name, (t, _v, _s)) in enumerate(fams.items()))
        + "\n\ndef load():\n    return os.environ.get('MODE', 'dev')\n")
    (tmp_path / "prod.env").write_text("MODE=prod\n" + all_text + "\n")
    # transcript: secrets in a prompt, a tool command, a tool output (past the truncation point too) and
    # in the assistant's answer; one secret straddles the 400-character cut
    anth = fams["anthropic"][1]
    long_out = ("log line\n" * 43) + f"leaked {anth} here\n" + all_text + "\n" + ("tail\n" * 200)
    assert 380 < long_out.index(anth) < 400 < long_out.index(anth) + len(anth)
    recs = [
        {"type": "user", "sessionId": "s", "cwd": "/w", "timestamp": "2026-01-01T00:00:00Z",
         "message": {"role": "user", "content": "Deploy with this config please:\n" + all_text}},
        {"type": "assistant", "sessionId": "s", "timestamp": "2026-01-01T00:00:01Z", "message": {
            "id": "m1", "role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "Bash",
                 "input": {"command": f"curl -H 'Authorization: Bearer {fams['bearer'][1]}' "
                                      f"-u admin:{fams['password-in-url'][1]} https://x && echo {fams['github'][1]}"}},
                {"type": "tool_use", "id": "t2", "name": "Read", "input": {"file_path": "/w/.env"}}]}},
        {"type": "user", "sessionId": "s", "timestamp": "2026-01-01T00:00:02Z", "message": {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": long_out},
            {"type": "tool_result", "tool_use_id": "t2", "content": all_text}]}},
        {"type": "assistant", "sessionId": "s", "timestamp": "2026-01-01T00:00:03Z", "message": {
            "id": "m2", "role": "assistant", "content": [
                {"type": "text", "text": f"Deployed. I used {fams['stripe'][1]} as asked."}]}},
    ]
    (tmp_path / "session.jsonl").write_text("\n".join(json.dumps(x) for x in recs) + "\n")
    outputs = {}
    # prod.env is not source code (no language): it is read as a document, in config style
    for kind, rel in (("doc", "README.md"), ("code", "settings.py"), ("doc", "prod.env"),
                      ("transcript", "session.jsonl")):
        source = SourceConfig(key="k", kind=kind, root=str(tmp_path), auto_kind=rel == "README.md",
                              max_line_chars=100_000)
        entry = next(e for e in list_source(tmp_path, source).files if e.path == rel)
        res = read_entry(tmp_path, entry, source)
        assert isinstance(res, list), (rel, res)
        outputs[rel] = res[0]
    for rel, doc in outputs.items():
        blob = doc.text + "\n" + doc.title + "\n" + json.dumps(doc.meta)
        leaked = [v for v in values if v in blob]
        assert not leaked, f"{rel} leaks {leaked}"
        assert sum(doc.meta["redactions"].values()) >= 10, (rel, doc.meta["redactions"])
    assert "How to run the payments service locally." in outputs["README.md"].text
    assert "Ask the platform team for access." in outputs["README.md"].text
    assert "def load():\n    return os.environ.get('MODE', 'dev')" in outputs["settings.py"].text
    assert "MODE=prod" in outputs["prod.env"].text
    t = outputs["session.jsonl"].text
    assert "Deploy with this config please:" in t and "Deployed. I used [REDACTED:stripe-key] as asked." in t
    assert "### tool: Bash curl -H 'Authorization: Bearer [REDACTED:" in t
    assert "leaked [REDACTED:anthropic-key]" in t                  # whole, although it straddled the cut


def test_redaction_speed(tmp_path):
    """Measured throughput (CPU time) on transcript-like mixed text with a few secrets sprinkled in."""
    fams = planted()
    chunk = ("### tool: Bash pytest -q\n\n" + "    x = compute(value)  # ünïcode ✓ line of code\n" * 40
             + "User: please check the config in settings.yaml, key: value, password policy\n"
             + "Traceback (most recent call last):\n  File \"/w/app.py\", line 10, in <module>\n")
    parts = []
    for i in range(2400):
        parts.append(chunk)
        if i % 100 == 0:
            parts.append(list(fams.values())[i // 100 % len(fams)][0] + "\n")
    text = "".join(parts)
    assert len(text) > 5_000_000
    t = time.process_time()
    out, counts = redact(text)
    cpu = time.process_time() - t
    mbps = len(text) / 1e6 / cpu
    print(f"\nredaction: {len(text) / 1e6:.1f} MB in {cpu:.2f} s CPU = {mbps:.1f} MB/s; {counts}")
    assert sum(counts.values()) >= 22
    assert mbps > 2.0


@pytest.mark.parametrize("corpus", ["adr-alphagov+govuk-aws-81ee9f6e91fd",
                                    "adr-alphagov+govuk-infrastructure-d9b7454f2606",
                                    "adr-arachne-framework+architecture-060a956277a5",
                                    "adr-nats-io+nats-architecture-and-design-f5f5126268f8"])
def test_real_adrs_are_left_alone(corpus):
    """On the real ADR corpora nothing is redacted but base64/base32 blobs in four NATS ADRs."""
    path = Path(__file__).resolve().parents[1].parent / "shared" / "corpora" / f"{corpus}.tar.gz"
    if not path.exists():
        pytest.skip("corpus not available")
    hits = {}
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            if m.isfile() and m.name.endswith(".md"):
                text = tar.extractfile(m).read().decode("utf-8")
                found = find_secrets(text)
                if found:
                    hits[m.name.rsplit("/", 1)[-1]] = {slug for _s, _e, slug in found}
    # NATS: certificate / OCSP blobs (ADR-38) and nkey public ids (ADR-13, 14, 26: base32, entropy > 4.5).
    # Kept on purpose: NATS seeds, which are secrets, look the same.
    expected = {n: {"high-entropy-string"} for n in ("ADR-13.md", "ADR-14.md", "ADR-26.md", "ADR-38.md")} \
        if "nats" in corpus else {}
    assert hits == expected
