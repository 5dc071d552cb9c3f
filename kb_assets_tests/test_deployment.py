"""The compose deployment, checked without a Docker engine: the file is valid against the Compose
Specification's JSON schema (committed under fixtures/compose/, see PROVENANCE.md), and says what a
deployment needs: one image built once with CPU torch, a daemon, healthchecks, depends_on healthy, restart
policies, safe.directory, the workspace file copied where the webserver and daemon read it, psycopg2 URLs,
and no secret in the file."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
SCHEMA = Path(__file__).parent / "fixtures" / "compose" / "compose_spec.json"
DAGSTER_SERVICES = ("code", "webserver", "daemon")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def _validate(doc: dict) -> None:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft201909Validator(schema, format_checker=jsonschema.FormatChecker()).validate(doc)


def test_compose_file_is_valid_against_the_compose_spec(compose):
    _validate(compose)


def test_the_schema_check_can_fail(compose):
    broken = copy.deepcopy(compose)
    broken["services"]["daemon"]["depends_on"]["postgres"]["condition"] = "service_healty"
    with pytest.raises(jsonschema.ValidationError):
        _validate(broken)
    broken = copy.deepcopy(compose)
    broken["services"]["code"]["healthcheck"]["intervall"] = "5s"
    with pytest.raises(jsonschema.ValidationError):
        _validate(broken)


def test_services_daemon_health_and_order(compose):
    services = compose["services"]
    assert set(services) == {"postgres", "pools", *DAGSTER_SERVICES}
    assert services["daemon"]["depends_on"]["pools"] == {"condition": "service_completed_successfully"}
    assert "concurrency set embedding_api" in " ".join(services["pools"]["command"])
    assert services["postgres"]["image"].startswith("pgvector/pgvector:")
    assert services["postgres"]["healthcheck"]["test"]
    assert services["daemon"]["command"][:2] == ["dagster-daemon", "run"]
    for name, svc in services.items():
        if name == "pools":         # one-shot
            assert svc["restart"] == "no"
            continue
        assert svc.get("restart") in ("unless-stopped", "always", "on-failure"), name
        if name == "postgres":
            continue
        deps = svc["depends_on"]
        assert deps["postgres"] == {"condition": "service_healthy"}, name
        if name != "code":
            assert deps["code"] == {"condition": "service_healthy"}, name
    for name in ("code", "webserver"):
        assert services[name]["healthcheck"]["test"], name


def test_one_image_built_once(compose):
    services = compose["services"]
    built = [n for n, s in services.items() if "build" in s]
    assert built == ["code"]
    images = {services[n]["image"] for n in (*DAGSTER_SERVICES, "pools")}
    assert len(images) == 1
    dockerfile = (DOCKER / "Dockerfile").read_text()
    # CPU-only torch installed before the project, so the pin never resolves to the CUDA build
    cpu = dockerfile.index("download.pytorch.org/whl/cpu")
    assert "torch==" in dockerfile[cpu - 200:cpu + 200]
    assert cpu < dockerfile.index("pip install --no-cache-dir .")
    assert "safe.directory" in dockerfile


def test_workspace_file_is_in_the_image_where_it_is_read(compose):
    dockerfile = (DOCKER / "Dockerfile").read_text()
    copies = dict(reversed(m.groups()) for m in re.finditer(r"^COPY\s+(\S+)\s+(\S+)\s*$", dockerfile, re.M))
    workdir = re.search(r"^WORKDIR\s+(\S+)", dockerfile, re.M).group(1)
    for name in ("webserver", "daemon"):
        cmd = compose["services"][name]["command"]
        ws = cmd[cmd.index("-w") + 1]
        assert copies.get(ws) == "docker/workspace.yaml", (name, ws, copies)
    workspace = yaml.safe_load((DOCKER / "workspace.yaml").read_text())
    grpc = workspace["load_from"][0]["grpc_server"]
    code_cmd = compose["services"]["code"]["command"]
    assert grpc["host"] == "code" and str(grpc["port"]) == code_cmd[code_cmd.index("-p") + 1]
    assert workdir == "/opt/kb_assets"
    # the instance config the processes read
    assert copies.get("/opt/dagster_home/dagster.yaml") == "docker/dagster.yaml"
    assert "DAGSTER_HOME=/opt/dagster_home" in dockerfile


def test_storage_urls_and_secrets_from_the_environment(compose):
    text = (DOCKER / "compose.yaml").read_text()
    env = compose["x-kb-env"]
    assert env["DAGSTER_PG_URL"].startswith("postgresql+psycopg2://")
    assert env["DAGSTER_PG_URL"].rsplit("/", 1)[-1] == "dagster"        # its own database, not kb's
    assert env["KB_DATABASE_URL"].rsplit("/", 1)[-1] == "kb"
    assert "CREATE DATABASE dagster" in (DOCKER / "initdb" / "10-dagster-database.sql").read_text()
    instance = yaml.safe_load((DOCKER / "dagster.yaml").read_text())
    assert instance["storage"]["postgres"]["postgres_url"] == {"env": "DAGSTER_PG_URL"}
    # every secret is interpolated from the environment, never written down
    secretish = re.compile(r"PASSWORD|_KEY$|SECRET|TOKEN")
    seen = set()
    for name, svc in compose["services"].items():
        for key, value in (svc.get("environment") or {}).items():
            if secretish.search(key):
                seen.add(key)
                assert str(value).startswith("${"), (name, key, value)
    assert {"POSTGRES_PASSWORD", "VOYAGE_API_KEY", "GEMINI_API_KEY", "KB_WEBHOOK_SECRET"} <= seen
    assert re.search(r"://kb:\$\{POSTGRES_PASSWORD", text)
    assert not re.search(r"://\w+:(?!\$\{)[^@\s]+@", text)


def test_dockerignore_keeps_the_context_small():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", ".kb", "kb_assets_tests"} <= ignored
    assert "kb_assets" not in ignored and "pyproject.toml" not in ignored
