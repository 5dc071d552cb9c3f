"""The nine secret families that leaked (issue 12 §6), each redacted: our detect-secrets plugins
(kb_assets/sources/secret_plugins.py) in texts, and names (a token in a file name) through safe_names.

Values are generated at run time from a seeded generator (fake, never a literal credential in the repo).
"""
from __future__ import annotations

import base64
import random
import string

import pytest

from kb_assets.sources.redaction import redact
from kb_assets.sources.safe_names import assign_names

RND = random.Random(20261201)
AL = string.ascii_letters + string.digits
HEX = "0123456789abcdef"
DJANGO_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789!@#$%^&*(-_=+)"


def r(n: int, alphabet: str = AL) -> str:
    return "".join(RND.choice(alphabet) for _ in range(n))


def aws_secret() -> str:
    while True:   # upper, lower and a digit, as real ones have
        v = r(40, AL + "/+")
        if any(c.isupper() for c in v) and any(c.islower() for c in v) and any(c.isdigit() for c in v):
            return v


def planted_more() -> dict[str, tuple[str, str, str]]:
    """family -> (text containing it, the secret value, expected placeholder type): the nine that leaked
    (the file-name family is `token_file_name`)."""
    aws1, aws2 = aws_secret(), aws_secret()
    django = r(20, DJANGO_CHARS[:36]) + "(%)" + r(24, DJANGO_CHARS) + "9"
    django_insecure = "django-" + "insecure-" + r(18, DJANGO_CHARS[:36]) + "%(" + r(20, DJANGO_CHARS) + ")"
    sig = r(30) + "%2B" + r(9) + "%3D"
    basic = base64.b64encode(("deploy:" + r(18)).encode()).decode()
    dapi = "da" + "pi" + r(32, HEX)
    dop = "dop" + "_v1_" + r(64, HEX)
    shp = "shp" + "at_" + r(32, HEX)
    mysql_pw = r(12) + "7"
    mysql_quoted = r(10) + "4!"
    return {
        "aws-secret-prose": (f"The AWS secret access key for the ledger account is {aws1}, rotate it monthly.",
                             aws1, "aws-secret-key"),
        "aws-secret-cli": (f"aws configure set aws_secret_access_key {aws2}", aws2, "aws-secret-key"),
        "django-secret-key": (f"DJANGO_SECRET_KEY={django}", django, "django-secret-key"),
        "django-insecure": (f"SECRET_KEY = '{django_insecure}'", django_insecure, "django-secret-key"),
        "azure-sas": ("https://ledger.blob.core.windows.net/exports/day.csv?sv=2022-11-02&ss=b&srt=o&sp=r"
                      f"&se=2026-12-31T00:00:00Z&spr=https&sig={sig}", sig, "azure-sas-signature"),
        "basic-auth-header": (f"curl -H 'Authorization: Basic {basic}' https://ledger.internal/api",
                              basic, "basic-auth-header"),
        "databricks": (f"export DATABRICKS_HOST=https://x.cloud.databricks.com; use {dapi} for jobs", dapi,
                       "databricks-token"),
        "digitalocean": (f"doctl auth init --context ledger -t {dop}", dop, "digitalocean-token"),
        "shopify": (f"the storefront app calls the admin API with {shp}", shp, "shopify-token"),
        "mysql-p": (f"mysql -u ledger -p{mysql_pw} -h db.internal ledger < seed.sql", mysql_pw, "mysql-password"),
        "mysqldump-quoted": (f"mysqldump -uroot -p'{mysql_quoted}' ledger > dump.sql", mysql_quoted,
                             "mysql-password"),
    }


def token_file_name() -> tuple[str, str]:
    """(a file name holding a GitHub token, the token)."""
    tok = "gh" + "p_" + r(36)
    return f"notes/rotation-{tok}.md", tok


@pytest.mark.parametrize("family", sorted(planted_more()))
def test_each_leaking_family_is_redacted(family):
    text, value, slug = planted_more()[family]
    out, counts = redact("Intro words stay.\n" + text + "\nOutro words stay.")
    assert value not in out, out
    assert f"[REDACTED:{slug}]" in out and counts.get(slug, 0) >= 1, (out, counts)
    assert out.startswith("Intro words stay.\n") and out.endswith("\nOutro words stay.")


@pytest.mark.parametrize("family", sorted(planted_more()))
def test_each_family_inside_json_and_code(family):
    """The same values as a transcript stores them (a JSON string) and as code assigns them."""
    import json

    text, value, _slug = planted_more()[family]
    for wrapped in (json.dumps({"command": text}), f"CMD = {json.dumps(text)}\n"):
        out, _ = redact(wrapped)
        assert value not in out, (family, out)


def test_token_in_a_file_name_is_redacted_in_the_stored_name():
    name, tok = token_file_name()
    stored = assign_names([name, "notes/plain.md"])
    assert stored == {name: "notes/rotation-[REDACTED:github-token].md"}
    assert tok not in stored[name]


def test_the_plugins_work_as_detect_secrets_plugins():
    """detect-secrets' own line scan with our plugin classes finds the values too (so they can be used in a
    pre-commit baseline as well)."""
    from kb_assets.sources import secret_plugins

    fams = planted_more()
    for family, (text, value, _slug) in fams.items():
        found = [v for cls in secret_plugins.PLUGINS for v in cls().analyze_string(text)]
        assert value in found or any(value in v for v in found), (family, found)


def test_lookalikes_are_kept():
    text = ("commit 9fceb02d0ae598e95dc970b74767f19372d61af8 in the aws repo fixed it\n"
            "SECRET_KEY = os.environ['DJANGO_SECRET_KEY']\nSECRET_KEY = get_random_secret_key()\n"
            "Authorization: Basic auth is what the legacy gateway uses\n"
            "mysql -u root -p ledger   # prompts for the password\nmysql -P 3306 -h db ledger\n"
            "the SAS URL has a sig= parameter at the end\ndapi is the prefix of Databricks tokens\n"
            "aws s3 cp s3://bucket/path/to/some/file/name.txt ./local/copy/of/it.txt\n")
    out, counts = redact(text)
    assert counts == {} and out == text


def test_detect_secrets_scan_loads_the_plugin_file(tmp_path):
    """`detect-secrets scan --plugin kb_assets/sources/secret_plugins.py` (a pre-commit baseline can use them)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from kb_assets.sources import secret_plugins

    fams = planted_more()
    (tmp_path / "notes.txt").write_text("\n".join(t for t, _v, _s in fams.values()) + "\n")
    exe = Path(sys.executable).parent / "detect-secrets"
    env = dict(os.environ, PYTHONPATH=str(Path(secret_plugins.__file__).parents[2]))
    proc = subprocess.run([str(exe), "scan", "--plugin", secret_plugins.__file__, "notes.txt"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    found = {r["type"] for r in json.loads(proc.stdout)["results"].get("notes.txt", [])}
    assert {cls.secret_type for cls in secret_plugins.PLUGINS} <= found, found
