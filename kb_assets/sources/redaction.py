"""Secret redaction: every secret value becomes a typed placeholder such as [REDACTED:aws-access-key].

Detectors come from detect-secrets (1.5.0, Yelp, maintained): its regex plugins (AWS, GitHub, GitLab,
Slack, Stripe, OpenAI, JWT, basic auth in URLs, SendGrid, PyPI, npm, Twilio, Discord, Telegram, Azure,
Mailchimp, Square, Artifactory, IBM, SoftLayer, Cloudant), its KeywordDetector (secret-sounding names with
quoted values), its Base64 high-entropy-string detector (quoted strings, entropy > 4.5) and its
false-positive heuristics (templated values, $VARS, indirect references, UUIDs, sequential strings).
We do not call its line scanner: we run the plugins' own compiled patterns over the whole text with
finditer (C speed, exact spans for in-place replacement); the keyword detector, which is line-based by
design, runs only on the lines that contain one of its keywords.

Measured on planted samples (kb_assets_tests/test_sources_redaction.py builds the same families), the
named detect-secrets plugins MISS: OpenAI project keys without the legacy "T3BlbkFJ" marker
(sk-proj-...), Anthropic keys (sk-ant-...), Google API keys (AIza...), Voyage keys (pa-...), GitHub
fine-grained tokens (github_pat_...), Slack app tokens (xapp-...), Stripe test keys (sk_test_...),
Hugging Face (hf_...) and npm (npm_...) tokens outside .npmrc, opaque "Authorization: Bearer ..." tokens,
credentials on command lines (curl -u user:password, --password=...),
passwords in URLs that contain ! $ & * + , ; = (their character class stops there), unquoted
`FOO_TOKEN=...` / `DB_PASSWORD=...` assignments (KeywordDetector requires quotes for unknown file
types and has no TOKEN keyword), and private-key bodies (PrivateKeyDetector only flags the BEGIN line:
the base64 body would stay). Those are added below as precise patterns (EXTRA_RULES), nothing else.
Also, GitHub/GitLab plugins report only the prefix ("ghp") as the secret value; we replace the whole match.

Left out on purpose: detect-secrets' public-IP detector (IP addresses are not secrets and are useful in
ops notes) and its hex high-entropy detector (measured on the PEP + ADR corpora: 38 hits, all of them
checksums, digests and commit ids; hex values assigned to secret-sounding names are still caught).

False positives measured on 15 MB of PEPs and ADRs: one keyword hit (a literal example password in PEP
522) and base64/base32 blobs in four NATS ADRs (certificates, OCSP responses, nkey public ids — kept
on purpose: NATS seeds, which are secrets, look the same). On 17 MB of SDK sources (google-genai,
requests, httpx, sqlalchemy, botocore...): example credentials in URLs (scott:tiger) and token-shaped test
fixtures, no code.

Speed (CPU time, one core): 18 MB/s over the 884 PEP/ADR files one by one (12 MB/s before the shortcuts
below), ~20 MB/s on 5 MB of transcript-like text (test_redaction_speed prints it), ~21 MB/s on the
synthetic benchmark corpus; on peerbench's synthetic markdown, whose paragraphs are long lines full of
"key" and "token", 7-8 MB/s, and 24-27 MB/s with the token-run pre-check (`Rule.min_run`). One
Aho-Corasick pass (pyahocorasick) finds every trigger literal and every literal prefix of the untriggered
rules: detect-secrets' line-based keyword detector and the rules with triggers run only on the lines that
contain one; a rule whose matches all begin with a literal prefix is tried only where a prefix begins (same
matches as a whole-text finditer); the few rules left run over the whole text (the engine's prefix search
runs at several hundred MB/s), behind a cheap gate where one is known. kb_assets_tests/test_sources_fast_paths.py
compares all of it with plain whole-text passes.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache

PLACEHOLDER = "[REDACTED:{}]"


@dataclass(frozen=True)
class Rule:
    slug: str
    regex: re.Pattern[str]
    group: int | str = 0                        # which group is the secret; "last" = last matched group
    validator: Callable[[str], bool] | None = None
    priority: int = 10                          # higher wins when spans overlap
    # Substrings every match contains (lowercase when ci). The regex then runs only on the lines that
    # contain one; an empty tuple means "run on the whole text" (right for patterns that start with a
    # literal: the engine's prefix search runs at several hundred MB/s). Triggers are only given to the
    # patterns measured slow on whole texts, and each is a literal the pattern itself requires.
    triggers: tuple[str, ...] = ()
    ci: bool = False
    # The match must not continue a longer token on its left (checked in code: a lookbehind at the start
    # of a pattern would disable the regex engine's fast literal-prefix search).
    boundary: bool = False
    # Strings one of which every match contains (triggered rules only): a trigger line without any of
    # them cannot match and is not searched (the generic rule needs its = or :, which prose lacks).
    requires: tuple[str, ...] = ()
    # A cheap pattern every match contains (untriggered rules without a literal prefix): a text where it
    # finds nothing is not scanned with the rule's own, slower pattern.
    gate: re.Pattern[str] | None = None
    # With boundary: only a letter or digit on the left disqualifies (names such as deploy-dapi…, x_ghp_…).
    left_alnum: bool = False
    # Every match contains a run of at least this many token characters (A-Z a-z 0-9 _ -): a text, then a
    # trigger line, without one is not searched with the rule's pattern (see _has_run).
    min_run: int = 0


# --- helpers ---------------------------------------------------------------------------------------

def shannon_entropy(s: str) -> float:
    if not s:
        return 0.0
    counts: dict[str, int] = {}
    for ch in s:
        counts[ch] = counts.get(ch, 0) + 1
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


_PLACEHOLDER_VALUE_RE = re.compile(
    r"""(?ix)^(?:
        \$\{?[\w.:-]*\}?|\{\{.*\}\}|\{[\w.]*\}|<[^>]*>|%\(?\w*\)?s?|:\w+|\*+|x+|\.{3}|…
        |(?:your|my|the|some|example|sample|dummy|fake|test|placeholder|change|changeme|redacted|secret|
           password|passwd|token|none|null|nil|true|false|undefined|todo|xxx|tbd)[\w.-]*
    )$""")


def _looks_like_placeholder(v: str) -> bool:
    return bool(_PLACEHOLDER_VALUE_RE.match(v)) or "REDACTED" in v


def _mixed_secret(v: str, *, min_len: int = 8, min_entropy: float = 3.0) -> bool:
    """A value that looks random enough to be a credential (not a word, a path or a reference)."""
    if len(v) < min_len or _looks_like_placeholder(v):
        return False
    if any(c in v for c in "()[]{}<>$ \t") or v.startswith(("os.", "env.", "process.", "self.", "http")):
        return False
    classes = sum(bool(re.search(p, v)) for p in (r"[a-z]", r"[A-Z]", r"\d", r"[^A-Za-z0-9]"))
    if classes < 2:
        return False
    if not re.search(r"\d", v) and shannon_entropy(v) < 3.5:
        return False   # identifiers like some_function_name, DatabaseUrl
    return shannon_entropy(v) >= min_entropy


def _token_like(v: str) -> bool:
    return _mixed_secret(v, min_len=16, min_entropy=3.2) and bool(re.search(r"\d", v))


# --- rules built from detect-secrets plugins -------------------------------------------------------

_DS_SLUGS = {
    "AWS Access Key": ("aws-access-key", "aws-secret-key"),
    "Artifactory Credentials": ("artifactory-token",),
    "Azure Storage Account access key": ("azure-storage-key",),
    "Basic Auth Credentials": ("password-in-url",),
    "Cloudant Credentials": ("cloudant-credentials",),
    "Discord Bot Token": ("discord-token",),
    "GitHub Token": ("github-token",),
    "GitLab Token": ("gitlab-token",),
    "IBM Cloud IAM Key": ("ibm-cloud-key",),
    "IBM COS HMAC Credentials": ("ibm-cos-key",),
    "JSON Web Token": ("jwt",),
    "Mailchimp Access Key": ("mailchimp-key",),
    "NPM tokens": ("npm-token",),
    "OpenAI Token": ("openai-key",),
    "PyPI Token": ("pypi-token",),
    "SendGrid API Key": ("sendgrid-key",),
    "Slack Token": ("slack-token", "slack-webhook"),
    "SoftLayer Credentials": ("softlayer-key",),
    "Square OAuth Secret": ("square-oauth-secret",),
    "Stripe Access Key": ("stripe-key",),
    "Telegram Bot Token": ("telegram-token",),
    "Twilio API Key": ("twilio-key",),
}
# Plugins whose regex captures the secret in a group (others: the whole match is the secret).
_DS_GROUP = {
    ("AWS Access Key", 1): 1, ("Basic Auth Credentials", 0): 1, ("NPM tokens", 0): 1,
    ("Cloudant Credentials", 0): "last", ("Cloudant Credentials", 1): "last", ("Cloudant Credentials", 2): 1,
    ("Cloudant Credentials", 3): 1, ("IBM Cloud IAM Key", 0): "last", ("IBM COS HMAC Credentials", 0): "last",
    ("SoftLayer Credentials", 0): "last", ("SoftLayer Credentials", 1): 1,
}
# (secret type, regex index) -> (triggers, case-insensitive). Index None: all regexes of the plugin.
_KEYWORDISH = ("key", "pwd", "pw", "pass", "token")
_DS_TRIGGERS: dict[tuple[str, int | None], tuple[tuple[str, ...], bool]] = {
    # Only patterns measured slower than ~250 MB/s on whole texts (no literal prefix) get triggers.
    ("AWS Access Key", 1): (("aws",), True),
    ("Artifactory Credentials", 0): (("AKC",), False),
    ("Artifactory Credentials", 1): (("AP",), False),
    ("Cloudant Credentials", 0): (_KEYWORDISH, True),
    ("Cloudant Credentials", 1): (_KEYWORDISH, True),
    ("Cloudant Credentials", 2): (("cloudant.com",), True),
    ("Cloudant Credentials", 3): (("cloudant.com",), True),
    ("IBM Cloud IAM Key", None): (_KEYWORDISH, True),
    ("IBM COS HMAC Credentials", None): (("secret",), True),
    ("Mailchimp Access Key", None): (("-us",), False),
    ("Slack Token", 0): (("xox",), True),
    ("Slack Token", 1): (("hooks.slack.com",), True),
    ("SoftLayer Credentials", 0): (_KEYWORDISH, True),
    ("SoftLayer Credentials", 1): (("api.softlayer.com",), True),
    ("Stripe Access Key", None): (("k_live_",), False),
    ("Telegram Bot Token", None): (tuple(f"{d}:" for d in range(10)), False),
}
# Gates for plugin patterns that start with a character class (keyed by the exact pattern, so a changed
# upstream pattern simply loses its gate): the fixed part in the middle of every match.
_DS_GATES = {
    r"[MNO][a-zA-Z\d_-]{23,25}\.[a-zA-Z\d_-]{6}\.[a-zA-Z\d_-]{27}": r"\.[a-zA-Z\d_-]{6}\.",   # Discord
}
# Value groups of detect-secrets' assignment patterns (IBM Cloud, IBM COS, Cloudant, SoftLayer: a keyword, an
# operator, then the value, which ends the pattern but for an optional quote) and their least length. Their
# triggers ("key", "pass", "token"...) hit most paragraphs of prose, where a value that long is rare, and the
# patterns are slow (these five were 3/4 of find_secrets' time on the synthetic corpus): a text or trigger line
# without such a run of token characters cannot match and is not searched with them.
_DS_VALUE_RUNS = {
    "([0-9a-f]{64})": 64, "([a-z]{24})": 24, "([a-z0-9]{64})": 64, "([a-f0-9]{48}(?![a-f0-9]))": 48,
    r"([a-zA-Z0-9_\-]{44}(?![a-zA-Z0-9_\-]))": 44,
}
_DS_VALUE_END = "(?:\"|\\'|)"
_DS_SKIP = {"Public IP (ipv4)", "Secret Keyword", "Base64 High Entropy String", "Hex High Entropy String",
            "Private Key"}


def _slugify(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")


def _value_run(pattern: str) -> int:
    """The least run of token characters in every match of an assignment pattern ending with one of
    _DS_VALUE_RUNS' groups (then an optional quote); 0 for any other pattern."""
    if not (pattern.startswith("(?:(?<=") and pattern.endswith(_DS_VALUE_END)):
        return 0
    head = pattern[:-len(_DS_VALUE_END)]
    return next((n for group, n in _DS_VALUE_RUNS.items() if head.endswith(group)), 0)


def _detect_secrets_rules() -> list[Rule]:
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins.base import RegexBasedDetector
    from detect_secrets.plugins.jwt import JwtTokenDetector

    rules: list[Rule] = []
    for secret_type, cls in sorted(get_mapping_from_secret_type_to_class().items()):
        if secret_type in _DS_SKIP or not issubclass(cls, RegexBasedDetector):
            continue
        slugs = _DS_SLUGS.get(secret_type, (_slugify(secret_type),))
        for i, rx in enumerate(cls.denylist):
            slug = slugs[min(i, len(slugs) - 1)]
            validator = JwtTokenDetector.is_formally_valid if cls is JwtTokenDetector else None
            if secret_type == "Basic Auth Credentials":
                validator = lambda v: not _looks_like_placeholder(v)  # noqa: E731
            if secret_type in ("IBM Cloud IAM Key", "IBM COS HMAC Credentials", "Cloudant Credentials",
                               "SoftLayer Credentials") and cls.denylist[i].pattern.startswith("(?:(?<="):
                # assignment patterns with an optional prefix match `key: some_function_name(`: the value
                # of a real key has digits and looks random
                validator = lambda v: bool(re.search(r"\d", v)) and shannon_entropy(v) > 3.5  # noqa: E731
            if secret_type == "Twilio API Key":
                validator = lambda v: bool(re.search(r"\d", v)) and shannon_entropy(v) > 3.5  # noqa: E731
            trig, ci = _DS_TRIGGERS.get((secret_type, i)) or _DS_TRIGGERS.get((secret_type, None)) or ((), False)
            gate = _DS_GATES.get(rx.pattern)
            rules.append(Rule(slug, rx, _DS_GROUP.get((secret_type, i), 0), validator, priority=20,
                              triggers=trig, ci=ci, gate=re.compile(gate, rx.flags) if gate else None,
                              min_run=_value_run(rx.pattern)))
    return rules


# --- what detect-secrets misses (measured; see the module docstring) ------------------------------

_E = r"(?![A-Za-z0-9_\-])"       # token end: not followed by more token characters
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")

_SECRET_WORDS = ("secret", "token", "key", "pass", "pwd", "credential", "auth")
EXTRA_RULES: list[Rule] = [
    Rule("anthropic-key", re.compile(r"sk-ant-[A-Za-z0-9_\-]{20,}"), priority=40, boundary=True),
    Rule("openai-key", re.compile(r"sk-(?!ant-)(?:proj-|svcacct-|admin-|None-)?[A-Za-z0-9_\-]{32,}" + _E),
         validator=lambda v: bool(re.search(r"\d", v) and re.search(r"[A-Za-z]", v[3:])), priority=30,
         boundary=True),
    Rule("google-api-key", re.compile(r"AIza[0-9A-Za-z_\-]{35}" + _E), priority=30, boundary=True),
    Rule("voyage-key", re.compile(r"pa-[A-Za-z0-9_\-]{40,}" + _E), validator=lambda v: _token_like(v),
         priority=30, boundary=True),
    Rule("github-token", re.compile(r"github_pat_[A-Za-z0-9_]{50,}"), priority=30, boundary=True),
    Rule("github-token", re.compile(r"gh[pousr]_[A-Za-z0-9]{36,}" + _E), priority=30, boundary=True),
    Rule("slack-token", re.compile(r"xox[a-z]-[A-Za-z0-9\-]{10,}"), priority=30, boundary=True),
    Rule("slack-token", re.compile(r"xapp-\d-[A-Za-z0-9\-]{20,}"), priority=30, boundary=True),
    *[Rule("stripe-key", re.compile(prefix + r"[0-9A-Za-z]{16,}"), priority=30, boundary=True)
      for prefix in ("sk_test_", "sk_live_", "rk_test_", "rk_live_", "pk_test_", "pk_live_", "whsec_")],
    Rule("huggingface-token", re.compile(r"hf_[A-Za-z]{30,}" + _E), priority=30, boundary=True),
    Rule("npm-token", re.compile(r"npm_[A-Za-z0-9]{36}" + _E), priority=30, boundary=True),
    Rule("gitlab-token", re.compile(r"gl(?:pat|dt|ft|soat|rt|cbt|imt|ptt|agent|oas)-[A-Za-z0-9_\-]{20,}"),
         priority=30, boundary=True),
    Rule("bearer-token", re.compile(r"(?i)\bbearer[ \t]+([A-Za-z0-9._~+/\-]{20,}=*)"), group=1,
         validator=lambda v: _mixed_secret(v, min_len=20), priority=15, triggers=("bearer",), ci=True),
    # scheme://user:password@host with any characters in the password (detect-secrets stops at !$&*+,;=)
    Rule("password-in-url", re.compile(
        r"\b[a-zA-Z][a-zA-Z0-9+.\-]{1,20}://[^\s:/?#@\"'<>\[\]]{1,100}:([^\s/?#@\"'<>]{1,200})@(?=[A-Za-z0-9\[])"),
         group=1, validator=lambda v: not _looks_like_placeholder(v), priority=25, triggers=("://",)),
    # curl -u user:password / --user user:password / wget --password=... on command lines (transcripts)
    Rule("generic-secret", re.compile(
        r"(?:(?<=\s)-u|--user|--proxy-user)[ =][\"']?[^\s:\"']{1,100}:([^\s\"']{4,200})"), group=1,
         validator=lambda v: not _looks_like_placeholder(v) and not v.startswith("$"), priority=13,
         triggers=("-u ", "--user", "--proxy-user")),
    Rule("generic-secret", re.compile(r"--(?:password|passwd|pass|token|api-key|secret)[ =][\"']?([^\s\"']{4,200})"),
         group=1, validator=lambda v: not _looks_like_placeholder(v) and not v.startswith("$"), priority=13,
         triggers=("--pass", "--token", "--api-key", "--secret")),
    # NAME_WITH_SECRET_WORD = value, quoted or not (env files, shell exports, YAML, transcripts). The name
    # may carry a suffix only after _ or - (so "Author:" and "tokens: 1200" are not names of secrets).
    Rule("generic-secret", re.compile(
        r"(?i)(?<![A-Za-z0-9])[A-Za-z0-9_.\-]*(?:secret|token|api[_\-]?key|apikey|access[_\-]?key|private[_\-]?key"
        r"|client[_\-]?key|signing[_\-]?key|encryption[_\-]?key|master[_\-]?key|_key|password|passwd|pwd|passphrase"
        r"|credentials?|auth)(?:[_\-][A-Za-z0-9_\-]*)?\\?[\"']?[ \t]*(?:=|:=|=>|:)[ \t]*\\?[\"'`]?"
        r"([^\s\"'`,;\\]{8,})"),      # \\? : quotes escaped inside a string literal (JSON in code)
         group=1, validator=lambda v: _generic_value(v), priority=12, triggers=_SECRET_WORDS, ci=True,
         requires=("=", ":")),
]


def _generic_value(v: str) -> bool:
    """A value assigned to a secret-sounding name that looks like a credential, not code or prose:
    random-looking (mixed classes, entropy), containing a digit unless very high entropy, and not a
    dotted reference (aws_eks_cluster.cluster.token) or a placeholder."""
    if not _mixed_secret(v):
        return False
    if re.fullmatch(r"[A-Za-z_][\w\-]*(?:\.[A-Za-z_][\w\-]*)+", v):
        return False
    if re.fullmatch(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+", v):
        return False      # a CONSTANT_NAME (the value is defined elsewhere)
    return bool(re.search(r"\d", v)) or shannon_entropy(v) >= 4.2


# A whole PEM / OpenSSH / PGP private key block; without its END line (a truncated paste) the base64 lines
# and "Proc-Type: ..." header lines that follow are taken, with real or JSON-escaped ("\\n") newlines.
# (The BLOCK group is "( BLOCK|)", never optional: a backreference to a group that did not take part
# never matches in Python.)
_PRIVATE_KEY_RE = re.compile(
    r"-----BEGIN ((?:[A-Z0-9]+ )*)PRIVATE KEY( BLOCK|)-----"
    r"(?:.{0,20000}?-----END \1PRIVATE KEY\2-----"
    r"|(?:(?:\\n|\r?\n)[ \t]*(?:[A-Za-z0-9+/=]{16,}|[A-Za-z][A-Za-z-]*: [^\n\\]*|(?=\r?\n|\\n)))*)",
    re.DOTALL,
)
_PUTTY_RE = re.compile(r"PuTTY-User-Key-File-\d:.*?(?:Private-MAC:[^\n]*|\Z)", re.DOTALL)

# detect-secrets KeywordDetector (line-based by design) runs on lines with one of its keywords; every
# keyword of its DENYLIST contains one of these.
_KEYWORD_TRIGGERS = ("key", "pass", "pwd", "secret", "contrase")
_B64_QUOTED_RE = re.compile(r"""(['"])([A-Za-z0-9+/=]{20,})\1""")


def _plugin_rules() -> list[Rule]:
    """Rules from our own detect-secrets plugins (secret_plugins.py: the families that leaked)."""
    from kb_assets.sources.secret_plugins import PLUGINS

    rules = []
    for cls in PLUGINS:
        for rx in cls.denylist:
            rules.append(Rule(cls.kb_slug, rx, cls.kb_group, cls.kb_validator, priority=cls.kb_priority,
                              triggers=cls.kb_triggers, ci=cls.kb_ci, boundary=cls.kb_boundary, left_alnum=True))
    return rules


@lru_cache(maxsize=1)
def _rules() -> tuple[Rule, ...]:
    return tuple(_detect_secrets_rules() + EXTRA_RULES + _plugin_rules())


@lru_cache(maxsize=1)
def _keyword_regexes() -> tuple[dict, dict]:
    from detect_secrets.plugins import keyword as kw
    return kw.QUOTES_REQUIRED_DENYLIST_REGEX_TO_GROUP, kw.CONFIG_DENYLIST_REGEX_TO_GROUP


# Every pattern of detect-secrets 1.5.0's quotes-required keyword set needs one of these characters (its
# ":", "=", "==", "!=", "=>" or trailing ";"), so a line without any cannot match it. Keyed by the patterns'
# fingerprint: other patterns (another detect-secrets version) get no such shortcut.
_QUOTED_NEEDS = ":=!;"
_QUOTED_FINGERPRINT = "e62544435e19fbd77f5f54d01093501371f9dcc5126598f9de1a4ab03fc5e0fe"


@lru_cache(maxsize=1)
def _quoted_needs() -> str:
    import hashlib

    quoted, _config = _keyword_regexes()
    digest = hashlib.sha256("\n".join(sorted(rx.pattern for rx in quoted)).encode()).hexdigest()
    return _QUOTED_NEEDS if digest == _QUOTED_FINGERPRINT else ""


def _false_positive(secret: str, line: str) -> bool:
    """detect-secrets' own heuristic filters (the ones that apply to a value in a line)."""
    from detect_secrets.filters import heuristic as h
    try:
        return (h.is_templated_secret(secret) or h.is_prefixed_with_dollar_sign(secret)
                or h.is_indirect_reference(line) or h.is_potential_uuid(secret)
                or h.is_sequential_string(secret) or _looks_like_placeholder(secret))
    except Exception:  # pragma: no cover - heuristics are simple; never let them break redaction
        return False


def _group_span(m: re.Match[str], group: int | str) -> tuple[int, int]:
    if group == "last":
        for g in range(m.re.groups, 0, -1):
            if m.group(g):
                return m.span(g)
        return m.span(0)
    if isinstance(group, int) and group and m.group(group) is not None:
        return m.span(group)
    return m.span(0)


def _trim(text: str, s: int, e: int) -> tuple[int, int]:
    """Do not eat the delimiters some plugin patterns include (whitespace, quotes, = and :)."""
    while s < e and text[s] in " \t\r\n\"'=:":
        s += 1
    while e > s and text[e - 1] in " \t\r\n\"'":
        e -= 1
    return s, e


def case_variants(literal: str) -> set[str]:
    """Spellings a case-insensitive trigger is looked for in: lower, UPPER and Title case (so apiKey,
    API_KEY, Api_Key, x-auth-token, Bearer, BEARER all trigger). A deliberately odd mixed case such as
    'pAsSwOrD' does not: that is the one trade-off of not lowercasing the whole text, which costs more
    than the scan itself on non-ASCII text."""
    low = literal.lower()
    return {low, low.upper(), low[:1].upper() + low[1:]}


@lru_cache(maxsize=1)
def _automaton():
    """One Aho-Corasick automaton (pyahocorasick) over every trigger literal and every literal prefix of
    the untriggered rules, or None if not installed. Value: (length, trigger owners, prefix rule ids)."""
    try:
        import ahocorasick
    except ImportError:  # pragma: no cover - the dependency is declared; the fallback is only slower
        return None
    words: dict[str, tuple[set[tuple[str, bool]], set[int]]] = {}
    for t, ci in _all_triggers():
        for v in (case_variants(t) if ci else {t}):
            words.setdefault(v, (set(), set()))[0].add((t, ci))
    for rid, prefixes in _prefixed_rules().items():
        for v in prefixes:
            words.setdefault(v, (set(), set()))[1].add(rid)
    a = ahocorasick.Automaton()
    for word, (owners, rids) in words.items():
        a.add_word(word, (len(word), tuple(owners), tuple(sorted(rids))))
    a.make_automaton()
    return a


# --- literal prefixes ------------------------------------------------------------------------------
# An untriggered rule used to cost one finditer pass over the whole text each (~40 passes). When every
# match of its pattern must begin with one of a few literal strings, the one Aho-Corasick pass above
# already finds each place where a match can begin, and `regex.match(text, q)` at those places, in
# order, skipping places inside the previous match, returns exactly the matches finditer returns (same
# engine, same start, lookbehinds still see the text before q). The prefixes are read from the parsed
# pattern itself, so they cannot drift from it; a pattern that does not start with literals keeps its
# whole-text pass.

_FAST_PATHS = True    # False: every untriggered rule scans the whole text, no `requires` skip (tests compare)
_MAX_PREFIXES = 64
_MIN_PREFIX = 3       # shorter ones ("//", "AC") would hit too often to pay off


def _parser_modules():
    try:
        from re import _constants, _parser  # Python >= 3.11
    except ImportError:  # pragma: no cover - older Pythons
        import sre_constants as _constants
        import sre_parse as _parser
    return _parser, _constants


def literal_prefixes(rx: re.Pattern[str]) -> tuple[str, ...] | None:
    """Strings one of which every match of rx starts with, or None when the pattern does not start with
    at least _MIN_PREFIX literal characters on every path (case-insensitive, a class, a repeat, ...)."""
    if rx.flags & re.IGNORECASE:
        return None
    try:
        parser, c = _parser_modules()
        prefixes, _complete = _expand(list(parser.parse(rx.pattern, rx.flags)), ("",), c)
    except Exception:  # pragma: no cover - an unknown parse tree: keep the whole-text pass
        return None
    if not prefixes or min(len(p) for p in prefixes) < _MIN_PREFIX:
        return None
    return tuple(sorted(set(prefixes)))


def _expand(items: list, prefixes: tuple[str, ...], c) -> tuple[tuple[str, ...], bool]:
    """Extend `prefixes` by the leading literal items; (prefixes, True) when every item was literal."""
    for op, av in items:
        if op is c.LITERAL:
            prefixes = tuple(p + chr(av) for p in prefixes)
        elif op is c.IN:
            if not all(o is c.LITERAL for o, _ in av) or len(prefixes) * len(av) > _MAX_PREFIXES:
                return prefixes, False
            prefixes = tuple(p + chr(ch) for p in prefixes for _, ch in av)
        elif op is c.SUBPATTERN:
            _group, add_flags, del_flags, sub = av
            if add_flags or del_flags:
                return prefixes, False
            prefixes, complete = _expand(list(sub), prefixes, c)
            if not complete:
                return prefixes, False
        elif op is c.BRANCH:
            out: list[str] = []
            complete = True
            for alt in av[1]:
                got, done = _expand(list(alt), prefixes, c)
                out.extend(got)
                complete = complete and done
            if len(out) > _MAX_PREFIXES:
                return prefixes, False
            prefixes = tuple(out)
            if not complete:      # some alternative stopped early: nothing after the branch is known
                return prefixes, False
        else:
            return prefixes, False
    return prefixes, True


@lru_cache(maxsize=1)
def _prefixed_rules() -> dict[int, tuple[str, ...]]:
    """Index in _rules() -> literal prefixes, for the untriggered rules that have them."""
    out: dict[int, tuple[str, ...]] = {}
    for i, rule in enumerate(_rules()):
        if not rule.triggers:
            prefixes = literal_prefixes(rule.regex)
            if prefixes:
                out[i] = prefixes
    return out


@lru_cache(maxsize=1)
def _all_triggers() -> tuple[tuple[str, bool], ...]:
    out: set[tuple[str, bool]] = set()
    for r in _rules():
        out.update((t, r.ci) for t in r.triggers)
    out.update((t, True) for t in _KEYWORD_TRIGGERS)
    return tuple(sorted(out))


_ASCII_LOWER = {c: c + 32 for c in range(65, 91)}


def _lower_same_length(text: str) -> str:
    low = text.lower()
    # str.lower can change lengths (e.g. "İ"): then lower ASCII only, which keeps offsets.
    return low if len(low) == len(text) else text.translate(_ASCII_LOWER)


class _Lines:
    """For each trigger literal, the start offsets of the lines that contain it; for each prefixed rule,
    the offsets where one of its literal prefixes starts (None: not collected, scan the whole text)."""

    def __init__(self, text: str):
        self.text = text
        self.hits: dict[tuple[str, bool], set[int]] = {}
        self.at: dict[int, list[int]] | None = None
        if not text:
            return
        auto = _automaton()
        if auto is None:
            self._scan_find()
            return
        self.at = {}
        self._scan(auto, text)

    def _scan(self, auto, hay: str) -> None:
        text = self.text
        ls, le = 0, -1
        hits = self.hits
        at = self.at
        for end, (length, owners, rids) in auto.iter(hay):
            start = end - length + 1
            for rid in rids:
                at.setdefault(rid, []).append(start)
            if not owners:
                continue
            if start > le:           # left the current line: find the new one
                ls = text.rfind("\n", 0, start) + 1
                le = text.find("\n", start)
                if le < 0:
                    le = len(text)
            for owner in owners:
                hits.setdefault(owner, set()).add(ls)

    def _scan_find(self) -> None:  # pragma: no cover - used only without pyahocorasick
        text = self.text
        low = _lower_same_length(text)
        for t, ci in _all_triggers():
            hay, lit = (low, t.lower()) if ci else (text, t)
            found = self.hits.setdefault((t, ci), set())
            i = hay.find(lit)
            while i >= 0:
                ls = text.rfind("\n", 0, i) + 1
                le = text.find("\n", i)
                found.add(ls)
                if le < 0:
                    break
                i = hay.find(lit, le + 1)

    def starts(self, literal: str, ci: bool) -> set[int]:
        return self.hits.get((literal, ci), set())

    def line_at(self, start: int) -> str:
        e = self.text.find("\n", start)
        return self.text[start:] if e < 0 else self.text[start:e]


# bytes.translate table: token characters -> "a", other ASCII -> " ", every byte of a non-ASCII character -> "a"
# (under IGNORECASE a class such as [a-z] also matches KELVIN SIGN and LONG S; a character of n UTF-8 bytes
# counts n, so the run found is never shorter than the regex's)
_RUN_TABLE = bytes(ord("a") if chr(b) in _TOKEN_CHARS or b >= 128 else ord(" ") for b in range(256))
_RUNS = {n: b"a" * n for n in (24, 44, 48, 64)}


def _runs(s: str) -> bytes:
    return s.encode("utf-8", "surrogatepass").translate(_RUN_TABLE)


def _has_run(s: str | bytes, n: int) -> bool:
    """Whether s (or its _runs) may contain n token characters in a row (C speed, ~0.7 GB/s; never False when
    it does)."""
    return (_RUNS.get(n) or b"a" * n) in (_runs(s) if isinstance(s, str) else s)


def find_secrets(text: str, *, config_style: bool = False) -> list[tuple[int, int, str]]:
    """Sorted, non-overlapping (start, end, slug) spans of secret values in text."""
    spans: list[tuple[int, int, str, int]] = []
    lines = _Lines(text)

    def take(rule: Rule, m: re.Match[str], base: int, hay: str) -> None:
        if rule.boundary and m.start() > 0 and hay[m.start() - 1] in (_ALNUM if rule.left_alnum else _TOKEN_CHARS):
            return
        s, e = _trim(hay, *_group_span(m, rule.group))
        if e - s < 4 or _filler(hay[s:e]):
            return
        if rule.validator is not None and not rule.validator(hay[s:e]):
            return
        spans.append((base + s, base + e, rule.slug, rule.priority))

    fast = _FAST_PATHS
    at = lines.at if fast else None
    prefixed = _prefixed_rules() if at is not None else {}
    hits = lines.hits
    text_runs: bytes | None = None      # _runs(text), once a rule with min_run has trigger lines
    for i, rule in enumerate(_rules()):
        if not rule.triggers:
            if i in prefixed:
                # Same matches as finditer: a match can only start where a prefix starts.
                qs = at.get(i)
                if qs:
                    pos = 0
                    match = rule.regex.match
                    for q in sorted(set(qs)):
                        if q < pos:
                            continue
                        m = match(text, q)
                        if m:
                            take(rule, m, 0, text)
                            pos = m.end()
                continue
            if fast and rule.gate is not None and not rule.gate.search(text):
                continue
            for m in rule.regex.finditer(text):
                take(rule, m, 0, text)
            continue
        starts: set[int] | None = None
        for t in rule.triggers:
            h = hits.get((t, rule.ci))
            if h:
                starts = h if starts is None else starts | h
        if not starts:
            continue
        requires = rule.requires if fast else ()
        min_run = rule.min_run if fast else 0
        if min_run:
            if text_runs is None:
                text_runs = _runs(text)
            if not _has_run(text_runs, min_run):
                continue
        for ls in sorted(starts):
            line = lines.line_at(ls)
            if requires and not any(r in line for r in requires):
                continue
            if min_run and not _has_run(line, min_run):
                continue
            for m in rule.regex.finditer(line):
                take(rule, m, ls, line)
    if "PRIVATE KEY" in text:
        for m in _PRIVATE_KEY_RE.finditer(text):
            spans.append((m.start(), m.end(), "private-key", 50))
    if "PuTTY-User-Key-File-" in text:
        for m in _PUTTY_RE.finditer(text):
            spans.append((m.start(), m.end(), "private-key", 50))
    # detect-secrets KeywordDetector, on the lines that contain one of its keywords.
    quoted, config = _keyword_regexes()
    regex_sets = (quoted, config) if config_style else (quoted,)
    needs = _quoted_needs() if fast else ""
    kw_starts: set[int] = set()
    for t in _KEYWORD_TRIGGERS:
        kw_starts.update(lines.starts(t, True))
    for ls in sorted(kw_starts):
        line = lines.line_at(ls)
        if len(line) > 4000:      # minified / data lines: the precise rules above still apply
            continue
        if not config_style and '"' not in line and "'" not in line and "`" not in line:
            continue              # the quotes-required patterns cannot match
        for regs in regex_sets:
            if regs is quoted and needs and not any(c in line for c in needs):
                continue
            for rx, grp in regs.items():
                m = rx.search(line)
                if not m:
                    continue
                s, e = _trim(line, *m.span(grp))
                value = line[s:e]
                if not _keyword_value(value) or _false_positive(value, line):
                    continue
                spans.append((ls + s, ls + e, "generic-secret", 11))
    # Quoted high-entropy base64 strings (detect-secrets Base64HighEntropyString, limit 4.5).
    for m in _B64_QUOTED_RE.finditer(text):
        v = m.group(2)
        if shannon_entropy(v) > 4.5 and not _false_positive(v, ""):
            spans.append((m.start(2), m.end(2), "high-entropy-string", 5))
    return _merge(spans)


_NAME_WORDS_RE = re.compile(r"(?i)key|secret|token|pass|pwd|auth|credential")


def _keyword_value(v: str) -> bool:
    """KeywordDetector reports any quoted value; keep the ones that can be a password: not `Pods`, not a
    name such as API_KEY_AUTH or "new-secret" (digit-free and itself containing a secret word)."""
    if len(v) < 6 or len(v) > 200 or " " in v.strip() or _filler(v):
        return False
    if re.fullmatch(r"[a-z]+", v) and len(v) < 12:
        return False      # a plain lowercase word
    if not re.search(r"\d", v) and _NAME_WORDS_RE.search(v) and re.fullmatch(r"[A-Za-z_.\-]+", v):
        return False
    return True


def _filler(v: str) -> bool:
    """Placeholders such as ghp_xxxxxxxx or AKIAXXXXXXXXXXXXXXXX: the tail is one or two repeated chars."""
    tail = v[-16:]
    return len(tail) >= 8 and len(set(tail)) <= 2


def _merge(spans: Iterable[tuple[int, int, str, int]]) -> list[tuple[int, int, str]]:
    out: list[list] = []
    for s, e, slug, pri in sorted(spans, key=lambda t: (t[0], -(t[1] - t[0]))):
        if out and s < out[-1][1]:
            last = out[-1]
            last[1] = max(last[1], e)
            if pri > last[3]:
                last[2], last[3] = slug, pri
            continue
        out.append([s, e, slug, pri])
    return [(s, e, slug) for s, e, slug, _ in out]


def redact(text: str, *, config_style: bool = False) -> tuple[str, dict[str, int]]:
    """Replace every secret value in text by [REDACTED:<type>]; return (text, {type: count}).

    config_style=True also accepts unquoted `password: value` forms (detect-secrets' rules for
    .env / YAML / INI / TOML / properties files); prose never gets them (they would eat sentences).
    """
    if not text:
        return text, {}
    spans = find_secrets(text, config_style=config_style)
    if not spans:
        return text, {}
    counts: dict[str, int] = {}
    parts: list[str] = []
    pos = 0
    for s, e, slug in spans:
        parts.append(text[pos:s])
        parts.append(PLACEHOLDER.format(slug))
        counts[slug] = counts.get(slug, 0) + 1
        pos = e
    parts.append(text[pos:])
    return "".join(parts), counts


def merge_counts(into: dict[str, int], more: dict[str, int]) -> dict[str, int]:
    for k, v in more.items():
        into[k] = into.get(k, 0) + v
    return into


CONFIG_STYLE_EXTENSIONS = frozenset({"env", "yaml", "yml", "ini", "cfg", "conf", "toml", "properties",
                                     "tfvars", "envrc"})


def config_style_for(path: str) -> bool:
    name = path.rsplit("/", 1)[-1].lower()
    if name.startswith(".env") or name.endswith(".env"):
        return True
    return name.rsplit(".", 1)[-1] in CONFIG_STYLE_EXTENSIONS if "." in name else False
