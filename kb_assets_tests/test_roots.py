"""Roots that are too broad (issue 12 §2): `/`, the home folder, system folders and listings past max_files
are refused with one line naming `allow_broad_root: true` (exit 2); /proc, /sys, /dev are never read."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kb_assets.config import ConfigError, check_environment, parse_config
from kb_assets.pipeline import sync_documents
from kb_assets.sources import discovery

PROSE = "The workers take batches with skip locked so that no chunk is embedded twice; retries back off.\n" * 2


def _cfg(root: str, base: Path, db_url: str | None = None, **source):
    data = {"sources": [{"key": "src", "kind": "doc", "root": root, "include": ["**/*.md"], **source}]}
    if db_url:
        data["database_url"] = db_url
    return parse_config(data, path=str(base / "kb.yaml"), base_dir=str(base))


@pytest.fixture
def no_listing(monkeypatch):
    """Any listing fails the test: a refused root must be refused before it is listed."""
    def boom(*a, **k):
        raise AssertionError("the root was listed")
    monkeypatch.setattr(discovery, "_walk", boom)
    monkeypatch.setattr(discovery, "_git_mode", boom)


@pytest.mark.parametrize("root", ["/", "/etc", "/usr", "/var", "/proc", "/sys", "/dev", "/proc/self"])
def test_broad_and_system_roots_are_refused(root, tmp_path, no_listing):
    cfg = _cfg(root, tmp_path)
    with pytest.raises(ConfigError) as err:
        check_environment(cfg)
    msg = str(err.value)
    assert "\n" not in msg and "sources[src].root" in msg and str(tmp_path / "kb.yaml") in msg
    if root.startswith(("/proc", "/sys", "/dev")):
        assert "never read" in msg
    else:
        assert "allow_broad_root: true" in msg
    # the stage refuses it as well (Dagster runs do not go through the CLI's checks)
    with pytest.raises(ConfigError):
        discovery.list_source(Path(root), cfg.sources[0])


def test_home_folder_is_refused_but_a_project_in_it_is_not(tmp_path, monkeypatch, no_listing):
    home = tmp_path / "home"
    (home / "proj").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    for root in ("~", str(home), str(tmp_path)):       # the home folder, and a folder above it
        with pytest.raises(ConfigError, match="allow_broad_root: true"):
            check_environment(_cfg(root, tmp_path))
    check_environment(_cfg("~/proj", tmp_path))


def test_allow_broad_root_lifts_the_refusal_but_never_for_proc(tmp_path, monkeypatch, no_listing):
    monkeypatch.setenv("HOME", str(tmp_path))
    check_environment(_cfg("/etc", tmp_path, allow_broad_root=True))
    check_environment(_cfg("~", tmp_path, allow_broad_root=True))
    with pytest.raises(ConfigError, match="never read"):
        check_environment(_cfg("/proc", tmp_path, allow_broad_root=True))


def test_a_listing_past_max_files_is_refused(tmp_path, db_url, conn):
    root = tmp_path / "notes"
    root.mkdir()
    for i in range(5):
        (root / f"n{i}.md").write_text(f"# Note {i}\n\n" + PROSE)
    cfg = _cfg(str(root), tmp_path, db_url, max_files=3)
    with pytest.raises(ConfigError) as err:
        sync_documents(conn, cfg, cfg.sources[0])
    msg = str(err.value)
    assert "sources[src].max_files" in msg and "allow_broad_root: true" in msg and "3" in msg
    assert str(tmp_path / "kb.yaml") in msg
    assert conn.execute("SELECT count(*) FROM documents").fetchone()[0] == 0
    ok = _cfg(str(root), tmp_path, db_url, max_files=3, allow_broad_root=True)
    assert sync_documents(conn, ok, ok.sources[0]).new == 5


def test_walking_slash_never_enters_proc_sys_dev(tmp_path):
    """With allow_broad_root, `/` may be walked, but /proc, /sys and /dev are not entered (everything else at
    the top is excluded here so that the walk stays short)."""
    others = [d for d in os.listdir("/") if d not in ("proc", "sys", "dev")]
    cfg = _cfg("/", tmp_path, allow_broad_root=True, include=[], exclude=others)
    listing = discovery.list_source(Path("/"), cfg.sources[0])
    touched = [e.path for e in listing.files] + [s.path for s in listing.skips]
    assert not [p for p in touched if p.split("/", 1)[0] in ("proc", "sys", "dev")], touched[:10]


def _kb(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **(env or {}))
    e.pop("KB_CONFIG", None)
    e.pop("KB_DATABASE_URL", None)
    return subprocess.run([sys.executable, "-m", "kb_assets.cli", *args], cwd=cwd, env=e, capture_output=True,
                          text=True, timeout=300)


def test_cli_refuses_slash_and_home_with_one_line_and_exit_2(tmp_path):
    (tmp_path / "kb.yaml").write_text("sources:\n  - {key: everything, kind: doc, root: /}\n"
                                      "  - {key: home, kind: doc, root: '~'}\n")
    for verb in ("index", "plan"):
        proc = _kb(verb, "--config", str(tmp_path / "kb.yaml"), cwd=tmp_path, env={"HOME": str(tmp_path / "h")})
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, (verb, proc.returncode, proc.stderr)
        assert "sources[everything].root" in lines[0] and "allow_broad_root: true" in lines[0]
    (tmp_path / "h").mkdir()
    (tmp_path / "kb.yaml").write_text("sources:\n  - {key: home, kind: doc, root: '~'}\n")
    proc = _kb("plan", "--config", str(tmp_path / "kb.yaml"), cwd=tmp_path, env={"HOME": str(tmp_path / "h")})
    assert proc.returncode == 2 and "is the home folder" in proc.stderr and "allow_broad_root: true" in proc.stderr


def test_kb_index_past_max_files_exits_2_naming_the_fix():
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="kbmf-", dir="/tmp"))      # short: the embedded server's socket
    (base / "notes").mkdir()
    (base / "dagster").mkdir()
    for i in range(3):
        (base / "notes" / f"n{i}.md").write_text(f"# Note {i}\n\n" + PROSE)
    # (a DAGSTER_HOME as deployed: telemetry off, else Dagster greets a fresh instance once on stderr)
    (base / "dagster" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    (base / "kb.yaml").write_text(f"data_dir: {base}/.kb\nsources:\n"
                                  f"  - {{key: notes, kind: doc, root: {base}/notes, max_files: 2}}\n")
    for extra in ([], ["--json"]):
        proc = _kb("index", "--quiet", *extra, "--config", str(base / "kb.yaml"), cwd=base,
                   env={"DAGSTER_HOME": str(base / "dagster")})
        assert proc.returncode == 2, proc.stderr
        # exactly one line: no Dagster step-failure record or traceback before it, not wrapped by rich
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith(f"kb index: source 'notes' failed: {base}/kb.yaml: sources[notes].max_files: "
                                   "the listing of"), lines[0]
        assert lines[0].endswith("or set `allow_broad_root: true` on the source"), lines[0]
