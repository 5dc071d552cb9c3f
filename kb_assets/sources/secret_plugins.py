"""detect-secrets plugins for the secret families its own plugins miss (issue 12 §6: they leaked).

Each class is an ordinary detect-secrets RegexBasedDetector (so `detect-secrets scan --plugin
kb_assets/sources/secret_plugins.py` finds the same values); redaction.py turns their patterns into
rules with the `kb_*` settings below: the placeholder type, the group that is the secret, a validator,
trigger literals (the line-local scan) and the left boundary. Every pattern captures the secret value
in its one matching group (detect-secrets reports the groups), or is the secret as a whole.

Families (measured as leaks with detect-secrets 1.5.0 and the rules before this module):
- AWS secret access keys outside quotes: prose ("the AWS secret key is …") and
  `aws configure set aws_secret_access_key …` (detect-secrets' AWS pattern needs quotes);
- Django SECRET_KEY values with `(`, `)`, `%`, `$`… (the generic rule rejects those as code), and
  `django-insecure-…` keys anywhere;
- Azure SAS signatures (`sig=` in a SAS URL or connection string);
- `Authorization: Basic <base64>` headers;
- Databricks (`dapi…`), DigitalOcean (`dop_v1_…`, `doo_v1_…`, `dor_v1_…`) and Shopify (`shpat_…`,
  `shpca_…`, `shppa_…`, `shpss_…`) tokens;
- MySQL / MariaDB passwords glued to `-p` on a command line (`mysql -pSECRET`, `-p'SECRET'`).
"""
from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Generator

from detect_secrets.plugins.base import RegexBasedDetector

ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


def _entropy(s: str) -> float:
    if not s:
        return 0.0
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in (s.count(ch) for ch in set(s)))


def _placeholder(v: str) -> bool:
    from kb_assets.sources.redaction import _looks_like_placeholder

    return _looks_like_placeholder(v)


def _aws_secret(v: str) -> bool:
    """40 base64 characters that look random: upper, lower and digits, not a hex digest."""
    return (len(v) == 40 and bool(re.search(r"[A-Z]", v)) and bool(re.search(r"[a-z]", v))
            and bool(re.search(r"\d", v)) and not re.fullmatch(r"[0-9a-fA-F]+", v) and _entropy(v) >= 4.0)


def _django_secret(v: str) -> bool:
    if _placeholder(v) or v.startswith(("$", "os.", "env", "get_", "config(", "settings.")):
        return False
    if v.startswith("django-insecure-"):
        return True
    return bool(re.search(r"\d", v)) and _entropy(v) >= 3.5


def _sas_signature(v: str) -> bool:
    return not _placeholder(v) and _entropy(v) >= 3.5


def _basic_credentials(v: str) -> bool:
    if _placeholder(v):
        return False
    try:
        decoded = base64.b64decode(v + "=" * (-len(v) % 4), validate=True).decode("utf-8")
        if ":" in decoded and decoded.isprintable():
            return True       # user:password, as RFC 7617 has it
    except (binascii.Error, UnicodeDecodeError, ValueError):
        pass
    return len(v) >= 16 and bool(re.search(r"\d", v)) and _entropy(v) >= 3.5


def _command_password(v: str) -> bool:
    return not _placeholder(v) and not v.startswith(("$", "%", "`"))


class _KbDetector(RegexBasedDetector):
    """Shared settings; analyze_string applies the validator, so detect-secrets' own scans agree."""

    kb_slug = "generic-secret"
    kb_group: int | str = 0
    kb_validator = None
    kb_priority = 30
    kb_triggers: tuple[str, ...] = ()
    kb_ci = False
    kb_boundary = True            # the match must not continue an alphanumeric run on its left

    def analyze_string(self, string: str) -> Generator[str, None, None]:
        for value in super().analyze_string(string):
            if self.kb_validator is None or type(self).kb_validator(value):
                yield value


class AwsSecretAccessKeyDetector(_KbDetector):
    """An AWS secret access key on a line that names AWS or a secret access key, quoted or not."""

    secret_type = "AWS Secret Access Key (unquoted)"
    kb_slug = "aws-secret-key"
    kb_validator = staticmethod(_aws_secret)
    kb_triggers = ("aws", "secret_access", "secret access", "secretaccess")
    kb_ci = True
    kb_boundary = False           # the pattern has its own boundaries (base64 characters)
    denylist = [re.compile(r"(?<![A-Za-z0-9/+=])([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])")]


class DjangoSecretKeyDetector(_KbDetector):
    """SECRET_KEY / DJANGO_SECRET_KEY values (any characters but blanks and quotes), django-insecure- keys."""

    secret_type = "Django Secret Key"
    kb_slug = "django-secret-key"
    kb_validator = staticmethod(_django_secret)
    kb_group = "last"
    kb_triggers = ("SECRET_KEY", "django-insecure-")
    kb_boundary = False
    denylist = [
        re.compile(r"(?<![A-Za-z0-9])[A-Z0-9_]*SECRET_KEY[\"']?[ \t]*(?:=|:=|:)[ \t]*[\"']?([^\s\"'`]{20,200})"),
        re.compile(r"(?<![A-Za-z0-9])(django-insecure-[a-z0-9!@#$%^&*()\-_=+]{20,})"),
    ]


class AzureSasSignatureDetector(_KbDetector):
    """The signature of an Azure shared access signature (SAS URL, SAS token, connection string)."""

    secret_type = "Azure SAS Signature"
    kb_slug = "azure-sas-signature"
    kb_validator = staticmethod(_sas_signature)
    kb_group = 1
    kb_triggers = ("sig=",)
    kb_boundary = False
    denylist = [re.compile(r"[?&;]sig=([A-Za-z0-9%+/]{20,}(?:%3[Dd]|=){0,2})")]


class BasicAuthHeaderDetector(_KbDetector):
    """`Authorization: Basic <base64 user:password>` (HTTP headers, curl -H, header dicts)."""

    secret_type = "Authorization Basic Header"
    kb_slug = "basic-auth-header"
    kb_validator = staticmethod(_basic_credentials)
    kb_group = 1
    kb_triggers = ("basic",)
    kb_ci = True
    kb_boundary = False
    denylist = [re.compile(r"(?i)authorization[\"']?[ \t]*[:=][ \t]*[\"']?basic[ \t]+([A-Za-z0-9+/]{8,}={0,2})")]


class DatabricksTokenDetector(_KbDetector):
    secret_type = "Databricks Token"
    kb_slug = "databricks-token"
    denylist = [re.compile(r"dapi[0-9a-f]{32}(?:-\d)?(?![A-Za-z0-9])")]


class DigitalOceanTokenDetector(_KbDetector):
    secret_type = "DigitalOcean Token"
    kb_slug = "digitalocean-token"
    denylist = [re.compile(r"do[opr]_v1_[0-9a-f]{64}(?![A-Za-z0-9])")]


class ShopifyTokenDetector(_KbDetector):
    secret_type = "Shopify Token"
    kb_slug = "shopify-token"
    denylist = [re.compile(r"shp(?:at|ca|pa|ss)_[0-9a-fA-F]{32}(?![A-Za-z0-9])")]


class MysqlCommandPasswordDetector(_KbDetector):
    """A password glued to -p on a mysql / mysqldump / mariadb command line (a lone -p prompts: no secret)."""

    secret_type = "MySQL Command-line Password"
    kb_slug = "mysql-password"
    kb_validator = staticmethod(_command_password)
    kb_group = "last"
    kb_triggers = ("mysql", "mariadb")
    kb_ci = True
    kb_boundary = False
    denylist = [re.compile(
        r"(?i:mysql\w*|mariadb\w*)\b[^\n|;&]*?[ \t]-p(?:'([^'\s]+)'|\"([^\"\s]+)\"|([^\s\"'-][^\s\"']*))")]


PLUGINS: tuple[type[_KbDetector], ...] = (
    AwsSecretAccessKeyDetector, DjangoSecretKeyDetector, AzureSasSignatureDetector, BasicAuthHeaderDetector,
    DatabricksTokenDetector, DigitalOceanTokenDetector, ShopifyTokenDetector, MysqlCommandPasswordDetector,
)
