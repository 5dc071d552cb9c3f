"""The reading shortcuts of the documents stage give exactly what the plain way gives.

Redaction: literal prefixes found by the one Aho-Corasick pass instead of one whole-text pass per rule, the
`requires` and `gate` pre-checks (compared with redaction._FAST_PATHS off, which is the former algorithm).
Also the generated-marker pre-check, the one-pass title and the /proc/self/fd open.
Secret-shaped values are generated at run time (random, fake).
"""
from __future__ import annotations

import base64
import os
import random
import re
import string
import tarfile
from pathlib import Path

import pytest

from kb_assets.models import Skip
from kb_assets.sources import content, readers, redaction
from kb_assets.sources.textutil import first_title, headings

RND = random.Random(7)
TOKEN = string.ascii_letters + string.digits + "_-"


def r(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    return "".join(RND.choice(alphabet) for _ in range(n))


def _jwt() -> str:
    def b64(obj: str) -> str:
        return base64.urlsafe_b64encode(obj.encode()).decode().rstrip("=")
    return b64('{"alg":"HS256","typ":"JWT"}') + "." + b64('{"sub":"%s"}' % r(12)) + "." + r(43, TOKEN)


def _secrets() -> list[str]:
    """One value per family (several per rule with a literal prefix), some of them deliberately broken."""
    up = string.ascii_uppercase + string.digits
    vals = [
        "AKIA" + r(16, up), "ASIA" + r(16, up), "A3TX" + r(16, up), "AccountKey=" + r(88, TOKEN[:-2] + "+/="),
        "ghp_" + r(36), "gho_" + r(40), "ghs_" + r(36) + "-x", "github_pat_11" + r(70, TOKEN[:-1]),
        "glpat-" + r(20), "glsoat-" + r(30), "glcbt-ab_" + r(24), "glimt-" + r(25), "glptt-" + r(40),
        "glagent-" + r(60), "gloas-" + r(64), "GR1348941" + r(30),
        "eyJ" + r(30) + "." + r(40) + "." + r(20), _jwt(), "sk-" + r(20) + "T3BlbkFJ" + r(20),
        "sk-proj-" + r(64, TOKEN),
        "sk-ant-api03-" + r(60, TOKEN), "sk-None-" + r(40), "pypi-AgEIcHlwaS5vcmc" + r(80, TOKEN),
        "SG." + r(22, TOKEN) + "." + r(43, TOKEN), "sq0csp-" + r(43, TOKEN), "AIza" + r(35, TOKEN),
        "pa-" + r(43, TOKEN), "pa-" + r(43, string.ascii_lowercase), "xoxb-" + r(12, string.digits) + "-" + r(24),
        "xapp-1-" + r(30), "sk_test_" + r(24), "sk_live_" + r(24), "rk_live_" + r(24), "pk_test_" + r(24),
        "whsec_" + r(32), "hf_" + r(34, string.ascii_letters), "npm_" + r(36), "AC" + r(32, "abcdef0123456789"),
        "SK" + r(32, "abcdef0123456789"), "M" + r(24, TOKEN) + "." + r(6, TOKEN) + "." + r(27, TOKEN),
        "123456789:" + r(35, TOKEN), r(32, "abcdef0123456789") + "-us12",
    ]
    return vals


HEX = "0123456789abcdef"


def _assignment_secrets() -> list[str]:
    """detect-secrets' assignment families (IBM Cloud, IBM COS, Cloudant, SoftLayer): keyword, operator, value;
    their values at the least length, one character short, and glued to non-ASCII (the run pre-check counts
    bytes: KELVIN SIGN and LONG S match [a-z] under IGNORECASE)."""
    vals = [f"ibm_cloud_iam_api_key = '{r(44, TOKEN)}'", f"iam_key: {r(44, TOKEN)}", f"cloud-api-token {r(44, TOKEN)}",
            f"ibm_cos_hmac_secret_access_key = {r(48, HEX)}", f"cos_secret_key: '{r(48, HEX)}'",
            f"cloudant_password = '{r(64, HEX)}'", f"cl_api_key: {r(24, string.ascii_lowercase)}",
            f"clou_pwd => '{r(24, string.ascii_lowercase)}'", f"softlayer_api_key = {r(64, HEX + 'xyz')}",
            f"sl_token: '{r(64, string.ascii_lowercase + string.digits)}'",
            f"cl_key = {r(23, string.ascii_lowercase)}", f"ibm_key = '{r(43, TOKEN)}'",
            f"cl_key = {r(20, string.ascii_lowercase)}\u212a{r(3, string.ascii_lowercase)}",
            f"clou_pass: '{r(12, string.ascii_lowercase)}\u017f{r(11, string.ascii_lowercase)}'"]
    return vals


def _contexts(v: str) -> list[str]:
    return [v, f"key = {v}\n", f'token: "{v}"', f"x{v}", f"{v}y and more", f"url https://u:{v}@host.example/x",
            f"é✓ {v}\n{v}", f"export FOO_SECRET={v}", f'{{"apiKey": "{v}"}}', f"Bearer {v}", f"--password={v}",
            f"curl -u admin:{v} http://x", f"a{v}{v}", f"//registry.npmjs.org/:_authToken={v}",
            # detect-secrets' keyword detector: each of its quoted forms
            f'password = "{v}"', f"if secret == '{v}':", f"db_pass: '{v}'", f'"{v}" != api_key',
            f"secret_key => '{v}'", f"private_key '{v}';", f"pwd `{v}`", f"'{v}' !! secret"]


def _noise(n: int) -> str:
    """Random text dense in prefix fragments, separators and near-misses."""
    frags = ["sk-", "sk-ant-", "ghp_", "gh", "glpat-", "gl", "eyJ", "AKIA", "A3T", "://", "xox", "xoxb-", "pa-",
             "hf_", "npm_", "SG.", "AIza", "pypi-", "whsec_", "AccountKey=", "GR1348941", "token", "key", "secret",
             "password", "Bearer ", "=", ":", '"', "'", "\n", " ", ".", "-", "_", "@", "/"]
    out = []
    for _ in range(n):
        out.append(RND.choice(frags) if RND.random() < 0.5 else r(RND.randint(1, 40), TOKEN + "./+="))
    return "".join(out)


def _texts() -> list[str]:
    texts = [c for v in _secrets() for c in _contexts(v)]
    texts += [f"{pre}{v}{post}" for v in _assignment_secrets()
              for pre, post in (("", ""), ("Some prose with a key word first.\n", "\nmore prose"), ("é ", " ✓"))]
    texts += [_noise(400) for _ in range(150)]
    texts.append("\n".join(texts[:200]))            # many secrets and lines in one text
    return texts


def _corpus_texts(limit: int = 400) -> list[str]:
    path = Path(__file__).resolve().parents[1].parent / "shared" / "corpora" / "python-peps-ba4deeb79695.tar.gz"
    if not path.exists():
        return []
    out = []
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            if m.isfile() and len(out) < limit:
                try:
                    out.append(tar.extractfile(m).read().decode("utf-8"))
                except UnicodeDecodeError:
                    pass
    return out


def test_fast_paths_find_exactly_what_the_whole_text_passes_find(monkeypatch):
    assert redaction._FAST_PATHS and redaction._automaton() is not None
    texts = _texts() + _corpus_texts()
    fast = {cs: [redaction.find_secrets(t, config_style=cs) for t in texts] for cs in (False, True)}
    monkeypatch.setattr(redaction, "_FAST_PATHS", False)
    slow = {cs: [redaction.find_secrets(t, config_style=cs) for t in texts] for cs in (False, True)}
    for cs in (False, True):
        diffs = [(t[:80], f, s) for t, f, s in zip(texts, fast[cs], slow[cs]) if f != s]
        assert not diffs, diffs[:3]
    found = {slug for spans in slow[False] for _s, _e, slug in spans}
    # the comparison is not vacuous: the families with a literal prefix were all found
    for slug in ("aws-access-key", "github-token", "gitlab-token", "jwt", "openai-key", "anthropic-key",
                 "stripe-key", "slack-token", "google-api-key", "voyage-key", "huggingface-token", "npm-token",
                 "sendgrid-key", "square-oauth-secret", "pypi-token", "azure-storage-key", "discord-token",
                 "generic-secret", "password-in-url", "ibm-cloud-key", "ibm-cos-key", "cloudant-credentials",
                 "softlayer-key"):
        assert slug in found, slug


def test_every_match_starts_with_one_of_its_rules_prefixes():
    rules = redaction._rules()
    prefixed = redaction._prefixed_rules()
    assert len(prefixed) >= 30          # the shortcut is in use for most untriggered rules
    texts = _texts()
    hits = 0
    for i, prefixes in prefixed.items():
        for t in texts:
            for m in rules[i].regex.finditer(t):
                assert m.group(0).startswith(prefixes), (rules[i].regex.pattern, m.group(0))
                hits += 1
    assert hits > 50


def test_literal_prefixes_of_patterns():
    lp = redaction.literal_prefixes
    assert lp(re.compile(r"(?:ab|cd)ef")) == ("abef", "cdef")
    assert lp(re.compile(r"abc[de]f")) == ("abcdf", "abcef")
    assert lp(re.compile(r"abc(?!x)d")) == ("abc",)             # stops at the lookahead
    assert lp(re.compile(r"abc(?:de|f[0-9])x")) == ("abcde", "abcf")
    assert lp(re.compile(r"(?:abc|)def")) == ("abcdef", "def")
    assert lp(re.compile(r"abcd?e")) == ("abc",)
    assert lp(re.compile(r"ab?cde")) is None                     # "a" alone is too short
    assert lp(re.compile(r"(?i)abcdef")) is None                 # case-insensitive: whole-text pass
    assert lp(re.compile(r"x*abcdef")) is None
    assert lp(re.compile(r"[a-z]bcdef")) is None
    assert lp(re.compile(r"(?:abc|de)f")) == ("abcf", "def")
    assert lp(re.compile(r"(?:abc|d)e")) is None
    assert lp(re.compile(r"abc(?i:de)f")) == ("abc",)            # a case-insensitive group ends the prefix


def test_the_discord_gate_is_implied_by_its_pattern():
    rule = next(x for x in redaction._rules() if x.slug == "discord-token")
    assert rule.gate is not None
    for _ in range(200):
        v = RND.choice("MNO") + r(RND.randint(23, 25), TOKEN) + "." + r(6, TOKEN) + "." + r(27, TOKEN)
        m = rule.regex.search(f"x {v} y")
        assert m and rule.gate.search(m.group(0))


def test_the_run_pre_check_is_implied_by_the_assignment_patterns():
    """Every match of a rule with min_run holds that many token characters in a row (as _has_run counts)."""
    rules = [x for x in redaction._rules() if x.min_run]
    assert {x.slug for x in rules} == {"ibm-cloud-key", "ibm-cos-key", "cloudant-credentials", "softlayer-key"}
    hits = 0
    for rule in rules:
        for t in _texts():
            for m in rule.regex.finditer(t):
                assert redaction._has_run(m.group(0), rule.min_run), (rule.slug, m.group(0))
                hits += 1
    assert hits >= 10
    assert not redaction._has_run("key = " + "a" * 23, 24) and redaction._has_run("key = " + "a" * 24, 24)
    assert redaction._has_run("key = " + "a" * 22 + "\u212a", 24)     # 3 UTF-8 bytes: counted as a run


# --- generated markers, titles, opening files ----------------------------------------------------------

MARKERS = ["// Code generated by protoc-gen-go. DO NOT EDIT.", "# @generated", "/* @Generated by tool */",
           "This file is automatically generated", "THIS CODE WAS AUTO-GENERATED", "this file has been autogenerated",
           "AUTO-GENERATED FILE. Do not edit!", "Autogenerated code - don't modify", "Created by make. DO NOT EDIT",
           "generated automatically by foo; do not modify", "DO NOT EDIT: this file is autogenerated",
           "Do Not Modify -- Auto-Generated", "GeNeRaTeD by x, dont edit", "created BY tool, Don't Edit"]


@pytest.mark.parametrize("head_lines", [None, 5])
def test_generated_marker_pre_check_misses_nothing(head_lines):
    samples = []
    for mk in MARKERS:
        for pad in ("", "x = 1\n" * 3, "ü✓ İstanbul ſ K\n" * 2, "y\n" * 400):
            samples += [pad + mk + "\nbody\n", mk + "\n" + pad, pad + mk.upper(), pad + mk.lower()]
    samples += ["def f():\n    return 1\n" * 50, "created the generator\n", "regenerate the created files\n"]
    found = 0
    for s in samples:
        end = 2048
        if head_lines is not None:
            pos = -1
            for _ in range(head_lines):
                pos = s.find("\n", pos + 1)
                if pos < 0:
                    break
            end = min(end, len(s) if pos < 0 else pos)
        m = content._GENERATED_RE.search(s, 0, end)
        expected = m.group(0)[:80] if m else None
        assert content.generated_marker(s, head_lines=head_lines) == expected, s[:120]
        found += expected is not None
    assert found > 40


def test_one_pass_title_equals_the_title_from_all_headings():
    docs = ["# Title\n\ntext", "text\n\n## Second\n\n# First level one", "Setext\n======\n\n# ATX",
            "```\n# not a heading\n```\n## Real", "<!--\n# hidden\n-->\nPara\n---\n", "no headings at all",
            "#\n\n## \n\n### Third", "Line\n---\n## two\n# one"]
    for _ in range(300):
        parts = RND.choices(["# A b", "## C", "#", "```", "~~~", "<!-- x", "-->", "text", "", "===", "---",
                             "  # indented", "| table", "> quote"], k=RND.randint(1, 12))
        docs.append("\n".join(parts))
    for d in docs:
        lines = d.split("\n")
        assert first_title(lines) == first_title(lines, headings(lines)), d


def _open_both(root: Path, rel: str, monkeypatch):
    def once():
        try:
            with readers._open_worktree(root, rel) as f:
                return f.read()
        except readers._SkipNow as exc:
            return (exc.reason, exc.detail)
    fast = once()
    with monkeypatch.context() as m:
        m.setattr(readers, "_open_worktree_fast", lambda root, full: None)
        checked = once()
    return fast, checked


def test_fast_open_decides_like_the_checked_open(tmp_path, monkeypatch):
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "a.md").write_text("inside")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x.md").write_text("outside")
    os.symlink("a.md", root / "d" / "alias.md")                       # final symlink, inside
    os.symlink(str(tmp_path / "out" / "x.md"), root / "escape.md")     # final symlink, outside
    os.symlink(str(tmp_path / "out"), root / "outdir")                 # folder symlink, outside
    os.symlink("d", root / "indir")                                     # folder symlink, inside
    os.symlink("loop.md", root / "loop.md")
    os.mkfifo(root / "pipe.md")
    cases = {"d/a.md": b"inside", "d/alias.md": b"inside", "indir/a.md": b"inside", "escape.md": "symlink-outside-root",
             "outdir/x.md": "symlink-outside-root", "loop.md": "not-regular-file", "pipe.md": "not-regular-file",
             "missing.md": "unreadable", "d": "not-regular-file"}
    for rel, want in cases.items():
        fast, checked = _open_both(root, rel, monkeypatch)
        assert fast == checked, rel
        assert (fast if isinstance(fast, bytes) else fast[0]) == want, (rel, fast)
    # the fast path really serves the plain case (else this test compares the checked path with itself)
    assert readers._open_worktree_fast(root, os.path.join(root, "d", "a.md")) is not None
    # a root given through a symlink: the files are inside its real path
    os.symlink(str(root), tmp_path / "via")
    assert _open_both(tmp_path / "via", "d/a.md", monkeypatch) == (b"inside", b"inside")


def test_sized_read_returns_the_same_bytes_and_limits(tmp_path):
    from kb_assets.config import SourceConfig
    from kb_assets.sources.discovery import FileEntry

    s = SourceConfig(key="k", kind="doc", root=str(tmp_path))
    for size in (0, 1, 99, 100, 101, 5000):
        (tmp_path / "f.md").write_bytes(b"x" * size)
        e = FileEntry("f.md", "sig")
        if size > 100:
            with pytest.raises(readers._SkipNow):
                readers._read_bytes(tmp_path, e, s, 100)
        else:
            assert readers._read_bytes(tmp_path, e, s, 100) == b"x" * size
    assert isinstance(readers.read_entry(tmp_path, FileEntry("f.md", "s"), s), list)
    assert isinstance(readers.read_entry(tmp_path, FileEntry("nope.md", "s"), s), Skip)


def test_blob_reader_reads_like_one_git_process_per_blob(tmp_path):
    from kb_assets.sources.gitutil import BlobReader, GitError, read_blob, run_git

    repo = tmp_path / "repo"
    repo.mkdir()
    files = {"empty.md": b"", "small.md": b"# Small\n\nwords\n", "nl.md": b"\n\n", "bin.md": bytes(range(256)) * 3,
             "big.md": os.urandom(200_000), "crlf.md": b"a\r\nb\r\n"}
    for name, data in files.items():
        (repo / name).write_bytes(data)
    run_git(repo, "init", "-q")
    run_git(repo, "add", ".")
    run_git(repo, "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "x")
    shas = {}
    for rec in run_git(repo, "ls-tree", "HEAD").stdout.decode().splitlines():
        meta, name = rec.split("\t")
        shas[name] = meta.split()[2]
    tree = run_git(repo, "rev-parse", "HEAD^{tree}").stdout.decode().strip()
    missing = "0123456789abcdef0123456789abcdef01234567"

    def plain(sha, limit):
        try:
            return read_blob(repo, sha, limit)
        except GitError as exc:
            return ("error", str(exc))

    asks = []
    for name, data in files.items():
        for limit in (0, len(data) - 1, len(data), len(data) + 1, 10_000_000):
            if limit >= 0:
                asks.append((shas[name], limit))
    asks += [(missing, 100), (tree, 10_000), (shas["small.md"], 100), (tree, 1), (shas["big.md"], 300_000)]
    expected = [plain(sha, limit) for sha, limit in asks]
    hinted = [sha for sha, _ in asks]
    rnd = random.Random(3)
    skipping = [sha for sha in hinted if rnd.random() < 0.7]
    shuffled = hinted[:]
    rnd.shuffle(shuffled)
    # no hint; exact hints; hints the caller partly skips; hints in another order; hints it never asks for
    for upcoming in ([], hinted, skipping, shuffled, [shas["big.md"]] * 40):
        with BlobReader(repo, upcoming, window=4) as br:
            for (sha, limit), want in zip(asks, expected):
                try:
                    got = br.read(sha, limit)
                except GitError as exc:
                    got = ("error", str(exc))
                assert got == want, (sha, limit, upcoming[:3])
            assert br.proc is not None and not br.failed    # the batch process served them all
        assert br.proc is None                               # closed on exit


def _longest_line_reference(text: str) -> tuple[int, int]:
    best, best_no, start, no = 0, 1, 0, 1
    while True:
        end = text.find("\n", start)
        length = (len(text) if end < 0 else end) - start
        if length > best:
            best, best_no = length, no
        if end < 0:
            return best, best_no
        start, no = end + 1, no + 1


def test_longest_line_is_the_first_of_the_longest():
    texts = ["", "\n", "a", "ab\ncd", "a\nbcd\nefg\n", "\n\n\nxyz", "x" * 50 + "\n" + "y" * 50]
    texts += ["\n".join(r(RND.randint(0, 9)) for _ in range(RND.randint(1, 30))) for _ in range(300)]
    for t in texts:
        assert content.longest_line(t) == _longest_line_reference(t), t


def _sniff_reference(head: bytes, nul_is_binary: bool = True) -> str | None:
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return None
    for magic, what in content._MAGIC:
        if head.startswith(magic):
            if magic in (b"MZ", b"ID3", b"RIFF") and b"\x00" not in head[:content.SNIFF_BYTES]:
                continue
            return f"{what} (magic bytes)"
    if content._FTYP.match(head[:12]):
        return "MP4/QuickTime/HEIF media (magic bytes)"
    nul = head.find(b"\x00", 0, content.SNIFF_BYTES) if nul_is_binary else -1
    if nul >= 0:
        return f"NUL byte at offset {nul} in the first {content.SNIFF_BYTES // 1024} KB"
    return None


def test_binary_sniff_with_its_one_call_pre_check():
    heads = [b"", b"plain text", b"MZ is text", b"MZ\x00bin", b"ID3 tag", b"RIFF\x00", b"\xff\xfeu\x00",
             b"\x00\x00\x00\x18ftypmp42"]
    heads += [m + tail for m, _ in content._MAGIC for tail in (b"", b"x" * 20, b"\x00")]
    heads += [os.urandom(RND.randint(0, 40)) for _ in range(500)]
    for h in heads:
        for nul in (True, False):
            assert content.sniff_binary(h, nul_is_binary=nul) == _sniff_reference(h, nul), h
