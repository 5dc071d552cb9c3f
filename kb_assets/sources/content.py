"""Content checks on bytes already read (bounded): binary sniff, UTF-8 decoding, generated markers,
minified code, long lines."""
from __future__ import annotations

import re

SNIFF_BYTES = 8192

# Magic numbers of common binary formats (most also contain NUL bytes, but not all in the first 8 KB:
# PDF and some image headers do not).
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "PNG image"), (b"GIF87a", "GIF image"), (b"GIF89a", "GIF image"),
    (b"\xff\xd8\xff", "JPEG image"), (b"%PDF-", "PDF document"), (b"PK\x03\x04", "ZIP archive"),
    (b"PK\x05\x06", "ZIP archive"), (b"\x1f\x8b", "gzip data"), (b"BZh", "bzip2 data"),
    (b"\xfd7zXZ\x00", "xz data"), (b"7z\xbc\xaf\x27\x1c", "7-Zip archive"), (b"Rar!\x1a\x07", "RAR archive"),
    (b"\x7fELF", "ELF executable"), (b"MZ", "Windows executable"), (b"\xca\xfe\xba\xbe", "Java class / Mach-O"),
    (b"\xcf\xfa\xed\xfe", "Mach-O binary"), (b"\xce\xfa\xed\xfe", "Mach-O binary"), (b"\x00asm", "WebAssembly"),
    (b"SQLite format 3\x00", "SQLite database"), (b"RIFF", "RIFF media"), (b"OggS", "Ogg media"),
    (b"ID3", "MP3 audio"), (b"\x00\x00\x01\x00", "ICO image"), (b"II*\x00", "TIFF image"),
    (b"MM\x00*", "TIFF image"), (b"wOFF", "WOFF font"), (b"wOF2", "WOFF2 font"), (b"\x28\xb5\x2f\xfd", "zstd data"),
    (b"PAR1", "Parquet data"), (b"\x93NUMPY", "NumPy array"), (b"\x80\x04\x95", "Python pickle"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "MS Office document"), (b"\x1a\x45\xdf\xa3", "Matroska/WebM media"),
)
_MAGIC_PREFIXES = tuple(m for m, _ in _MAGIC)
_FTYP = re.compile(rb"^....ftyp")  # MP4 / MOV / HEIC


def sniff_binary(head: bytes, *, nul_is_binary: bool = True) -> str | None:
    """A readable reason when the first bytes look binary, else None. JSON-lines readers pass
    nul_is_binary=False: a NUL there is one corrupt line (skipped and counted), not a binary file."""
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return None  # UTF-16 with a BOM: decoded below
    if head.startswith(_MAGIC_PREFIXES):     # one C call dismisses most files
        for magic, what in _MAGIC:
            if head.startswith(magic):
                if magic == b"MZ" and b"\x00" not in head[:SNIFF_BYTES]:
                    continue  # "MZ" is also plain text
                if magic == b"ID3" and b"\x00" not in head[:SNIFF_BYTES]:
                    continue
                if magic == b"RIFF" and b"\x00" not in head[:SNIFF_BYTES]:
                    continue
                return f"{what} (magic bytes)"
    if _FTYP.match(head[:12]):
        return "MP4/QuickTime/HEIF media (magic bytes)"
    nul = head.find(b"\x00", 0, SNIFF_BYTES) if nul_is_binary else -1
    if nul >= 0:
        return f"NUL byte at offset {nul} in the first {SNIFF_BYTES // 1024} KB"
    return None


class DecodeError(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def decode_text(data: bytes) -> str:
    """Bytes -> str with newlines normalised to \\n. Raises DecodeError(reason, detail)."""
    why = sniff_binary(data[:SNIFF_BYTES])
    if why:
        raise DecodeError("binary", why)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            text = data.decode("utf-16")
        except UnicodeDecodeError as exc:
            raise DecodeError("not-utf8", f"UTF-16 BOM but undecodable at byte {exc.start}") from None
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad = data[exc.start:exc.start + 4]
            raise DecodeError("not-utf8", f"not valid UTF-8: byte {bad[:1]!r} at offset {exc.start} "
                                          f"(save the file as UTF-8)") from None
    if "\x00" in text:
        raise DecodeError("binary", "NUL character in the text")
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


_GENERATED_RE = re.compile(
    r"(?i)(?:code generated\b.{0,120}\bdo not edit"
    r"|@generated\b"
    r"|\bthis (?:file|code) (?:is|was|has been) (?:automatically |auto-?)generated"
    r"|\bauto-?generated (?:file|code)\b.{0,80}\b(?:do not|don'?t) (?:edit|modify)"
    r"|\b(?:generated|created) (?:automatically )?by\b.{0,80}\b(?:do not|don'?t) (?:edit|modify)"
    r"|\bdo not (?:edit|modify)[^\n]{0,60}\b(?:auto-?)?generated\b)"
)


_COMMENT_PREFIX = re.compile(r"""[\s#/*!<\-;%"'({]*""")


def generated_marker(text: str, *, head_lines: int | None = None) -> str | None:
    """The generated-file marker near the top of a file, if any: first 2 KB (like linguist) for code; only
    the first head_lines lines for prose, where a generated block further down (a managed section of a
    README or CLAUDE.md) does not make the whole file generated."""
    end = 2048
    if head_lines is not None:
        pos = -1
        for _ in range(head_lines):
            pos = text.find("\n", pos + 1)
            if pos < 0:
                break
        end = min(end, len(text) if pos < 0 else pos)
    # Every alternative contains "generated" or "created" (no letter of which has a non-ASCII case
    # variant under re.IGNORECASE): most files are dismissed without running the regex.
    head = text[:end].lower()
    if "generated" not in head and "created" not in head:
        return None
    for m in _GENERATED_RE.finditer(text, 0, end):
        # In code the marker must open its line or follow a comment / docstring leader only: a test's string
        # literal that quotes a marker (put("gen.md", "<!-- This file was automatically generated …")) is
        # not one. Prose keeps any marker in its head lines.
        line_start = text.rfind("\n", 0, m.start()) + 1
        if head_lines is not None or _COMMENT_PREFIX.fullmatch(text, line_start, m.start()):
            return m.group(0)[:80]
    return None


def minified(text: str) -> str | None:
    """Minified code: very long lines on average (only meaningful for code)."""
    n = len(text)
    if n < 2000:
        return None
    lines = text.count("\n") + 1
    avg = n / lines
    if avg > 300:
        return f"average line length {avg:.0f} characters (minified or machine-written)"
    return None


def longest_line(text: str) -> tuple[int, int]:
    """(length, 1-based line number) of the longest line (the first one, on a tie)."""
    lengths = list(map(len, text.split("\n")))
    best = max(lengths)
    return best, lengths.index(best) + 1


def truncate_long_lines(text: str, max_chars: int) -> tuple[str, int]:
    """Cut lines longer than max_chars, with a visible marker; returns (text, lines cut)."""
    if len(text) <= max_chars:
        return text, 0
    out: list[str] = []
    cut = 0
    for line in text.split("\n"):
        if len(line) > max_chars:
            cut += 1
            line = line[:max_chars] + f" … [line truncated: {len(line):,} characters]"
        out.append(line)
    return ("\n".join(out), cut) if cut else (text, 0)
