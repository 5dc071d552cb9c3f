"""A configuration mistake is one line naming the file, the key and the fix, with exit code 2."""
from __future__ import annotations

import pytest

from kb_assets.cli import main
from kb_assets.config import load_config


def _run(tmp_path, capsys, yaml_text: str, *argv: str, env: dict | None = None, monkeypatch=None) -> tuple[int, str]:
    cfg = tmp_path / "kb.yaml"
    cfg.write_text(yaml_text, encoding="utf-8")
    (tmp_path / "docs").mkdir(exist_ok=True)
    for k, v in (env or {}).items():
        if v is None:
            monkeypatch.delenv(k, raising=False)
        else:
            monkeypatch.setenv(k, v)
    code = main([argv[0], "--config", str(cfg), *argv[1:]])
    err = capsys.readouterr().err.strip()
    return code, err


CASES = [
    ("unknown key", "sourcez: []\n", "sourcez", "unknown key"),
    ("unknown nested key", "sources:\n  - {key: a, kind: doc, root: docs, includes: ['*.md']}\n",
     "sources[a].includes", "unknown key"),
    ("missing root", "sources:\n  - {key: a, kind: doc, root: nowhere}\n", "sources[a].root", "does not exist"),
    ("unknown kind", "sources:\n  - {key: a, kind: wiki, root: docs}\n", "sources[a].kind", "use one of"),
    ("bad glob", "sources:\n  - {key: a, kind: doc, root: docs, include: ['docs/[abc.md']}\n",
     "sources[a].include", "bad glob"),
    ("bad key", "sources:\n  - {key: 'a b', kind: doc, root: docs}\n", "sources[a b].key", "letters"),
    ("duplicate key", "sources:\n  - {key: a, kind: doc, root: docs}\n  - {key: a, kind: code, root: docs}\n",
     "sources[1].key", "duplicate"),
    ("bad yaml", "sources: [\n", "line", "not valid YAML"),
]


@pytest.mark.parametrize("name,text,key,problem", CASES, ids=[c[0] for c in CASES])
def test_config_mistakes_are_one_clear_line(tmp_path, capsys, name, text, key, problem):
    code, err = _run(tmp_path, capsys, text, "index")
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert str(tmp_path / "kb.yaml") in err and key in err and problem in err and "—" in err


def test_voyage_without_key(tmp_path, capsys, monkeypatch):
    code, err = _run(tmp_path, capsys, "embedder: voyage\nsources:\n  - {key: a, kind: doc, root: docs}\n",
                     "index", env={"VOYAGE_API_KEY": None}, monkeypatch=monkeypatch)
    assert code == 2 and "embedder" in err and "VOYAGE_API_KEY" in err and len(err.splitlines()) == 1


def test_unreachable_database_url(tmp_path, capsys, monkeypatch):
    # A server that does not answer is an outage, not a configuration mistake: its own exit code (4), after
    # the bounded retry (database_retry_seconds), in one line naming where the URL came from.
    code, err = _run(tmp_path, capsys,
                     "database_url: postgresql://kb:s3cret@127.0.0.1:1/kb\ndatabase_retry_seconds: 0\n"
                     "sources:\n  - {key: a, kind: doc, root: docs}\n",
                     "status", monkeypatch=monkeypatch)
    assert code == 4 and len(err.splitlines()) == 1, err
    assert "unreachable" in err and "127.0.0.1:1" in err and "database_url" in err and "s3cret" not in err


def test_env_database_url_is_named_when_it_is_the_culprit(tmp_path, capsys, monkeypatch):
    code, err = _run(tmp_path, capsys, "database_retry_seconds: 0\nsources: []\n", "status",
                     env={"KB_DATABASE_URL": "postgresql://kb@127.0.0.1:1/kb"}, monkeypatch=monkeypatch)
    assert code == 4 and "KB_DATABASE_URL" in err


def test_unknown_database_on_a_live_server_is_a_configuration_mistake(tmp_path, capsys, monkeypatch, pg_server_url):
    import psycopg.conninfo as ci

    params = ci.conninfo_to_dict(pg_server_url)
    params["dbname"] = "no_such_database"
    code, err = _run(tmp_path, capsys, "sources: []\n", "status",
                     env={"KB_DATABASE_URL": ci.make_conninfo(**params)}, monkeypatch=monkeypatch)
    assert code == 2 and "KB_DATABASE_URL" in err and "does not exist" in err and len(err.splitlines()) == 1


def test_missing_config_file(tmp_path, capsys):
    code = main(["status", "--config", str(tmp_path / "nope.yaml")])
    err = capsys.readouterr().err
    assert code == 2 and "nope.yaml" in err and "does not exist" in err


def test_default_config_indexes_the_current_git_repository(tmp_path, monkeypatch):
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    cfg = load_config(None)
    assert [s.kind for s in cfg.sources] == ["doc", "code"]
    assert all(cfg.source_root(s) == tmp_path.resolve() for s in cfg.sources)
    assert "**/*.md" in cfg.sources[0].include and "**/*.rst" in cfg.sources[0].include
    assert cfg.data_path() == tmp_path.resolve() / ".kb"


def test_kb_config_env_is_used(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    p = tmp_path / "other.yaml"
    p.write_text("sources:\n  - {key: x, kind: adr, root: docs}\n")
    monkeypatch.setenv("KB_CONFIG", str(p))
    cfg = load_config(None)
    assert cfg.sources[0].key == "x" and cfg.source_root(cfg.sources[0]) == (tmp_path / "docs").resolve()
