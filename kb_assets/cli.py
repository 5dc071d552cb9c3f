"""The `kb` command: index, status, search, recall, show, eval, plan, mcp, serve, token.

Config mistakes print one line (file: key: problem — fix) and exit 2.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from pathlib import Path

from kb_assets.config import ConfigError, KbConfig, load_config, resolve_config_path

EXIT_CONFIG = 2


def _load(args, *, need_sources: bool = True) -> KbConfig:
    from kb_assets.config import check_environment

    cfg = load_config(args.config)
    check_environment(cfg, need_sources=need_sources)
    return cfg


def _connect(cfg: KbConfig):
    from kb_assets.store.db import connect, open_database

    return connect(open_database(cfg))


def _console(stderr: bool = False):
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # Piped output (agents, CI logs): wide enough that tables are not cut.
    return Console(stderr=stderr, highlight=False, width=None if stream.isatty() else 200)


# ---------------------------------------------------------------- index
class _RichProgress:
    """Shows each stage of each source as a progress bar (terminal only)."""

    def __init__(self, progress):
        self._p = progress
        self._task = None

    def start(self, label, total=None):
        self._task = self._p.add_task(label, total=total)

    def beside(self):
        """Another bar on the same display, for a stage running beside this one."""
        return _RichProgress(self._p)

    def advance(self, n=1):
        if self._task is not None:
            self._p.advance(self._task, n)

    def done(self):
        if self._task is not None:
            task = self._p.tasks[[t.id for t in self._p.tasks].index(self._task)]
            if task.total is not None:
                self._p.update(self._task, completed=task.total)
            else:       # counted as it went (a stage beside another): the bar ends full
                self._p.update(self._task, total=task.completed)
            self._task = None


def cmd_index(args) -> int:
    from kb_assets import index_run

    run = index_run.IndexRun().install()   # first: before Dagster swaps in its own signal handlers
    try:
        return _index(args, run)
    except Exception as exc:
        from kb_assets.pipeline.cancel import Cancelled

        if run.stopping and isinstance(exc, Cancelled):   # e.g. stopped while waiting for a source's lock
            run.finish()
        raise
    finally:
        run.close()


def _index(args, run) -> int:
    from kb_assets import index_run
    from kb_assets.pipeline import cancel, guard
    from kb_assets.store.locks import source_lock
    from kb_assets.store.status import capture_runs

    cfg = _load(args)
    keys = [s.key for s in cfg.sources if s.enabled]
    if args.source:
        unknown = [k for k in args.source if k not in keys]
        if unknown:
            raise ConfigError(cfg.config_path, "sources", f"no enabled source with key {unknown[0]!r}",
                              f"use one of: {', '.join(keys) or '(none)'}")
        keys = [k for k in keys if k in args.source]
    # The Dagster definitions read the config through $KB_CONFIG (partitions are the configured sources).
    path = resolve_config_path(args.config)
    if path is not None:
        os.environ["KB_CONFIG"] = str(path.resolve())
    from kb_assets.store.db import open_database

    url = open_database(cfg)  # start/migrate the database once, with a clear error if unreachable
    capture_runs()
    guard.clear()

    from kb_assets.pipeline import direct_run, source_state
    from kb_assets.pipeline import progress as progress_mod

    job = _DagsterJob(url)     # Dagster is imported only when a source has something to do
    console = _console(stderr=True)
    failures = []
    skipped_runs: set[str] = set()   # sources reported unchanged without a run
    runners: dict[str, str] = {}      # source -> "dagster" | "direct" (a small change, without a Dagster run)
    coverage: dict[str, dict | None] = {}   # source -> its direct run's chunk coverage (counted once, read twice)
    config_failed = False      # a configuration refusal inside a run (max_files...): exit 2, as before a run
    started = time.perf_counter()
    use_bars = sys.stderr.isatty() and not args.quiet
    bars = contextlib.nullcontext()      # no terminal: no bars, and rich.progress not imported (~5 ms)
    if use_bars:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console, transient=False)
    # after a stop request, a lost database or a configuration refusal, the CLI's own line says it all
    with bars, index_run.mute_dagster_when(lambda: run.stopping or guard.last_unreachable() is not None
                                           or guard.last_config_refusal() is not None):
        progress_mod.set_current(_RichProgress(bars) if use_bars else None)
        progress_mod.set_steps_in_process(True)
        try:
            for n, key in enumerate(keys):
                if run.stopping:   # a signal before this source started
                    run.pending = keys[n:]
                    break
                run.current, run.pending = key, keys[n + 1:]
                guard.clear()      # a refusal of the previous source does not mute this one's failures
                # one run per source at a time: wait for (or, --no-wait, refuse) another run holding it
                with source_lock(url, key, wait=not args.no_wait, check=cancel.check,
                                 on_wait=lambda line: console.print(f"kb index: {line}"),
                                 retry_seconds=cfg.database_retry_seconds):
                    # nothing could have changed since the source's last complete run: no Dagster run
                    state = source_state.source_fingerprint(cfg, cfg.source(key))
                    if not args.force:
                        with _connect(cfg) as conn:
                            if source_state.unchanged(conn, state, cfg, cfg.source(key)):
                                skipped_runs.add(key)
                    if key in skipped_runs:
                        if not args.quiet:
                            console.print(f"{key}: nothing changed since its last complete run — not run "
                                          "(--force runs it anyway)")
                        run.done.append(key)
                        run.current = None
                        continue
                    why_not = "--dagster or --force" if args.dagster or args.force else None
                    if why_not is None:
                        with _connect(cfg) as conn:
                            why_not = direct_run.why_not_direct(conn, cfg, cfg.source(key), state)
                    runners[key] = "dagster" if why_not else "direct"
                    if not use_bars and not args.quiet:
                        console.print(f"indexing {key} …" + ("" if why_not else " (a small change: without a "
                                                                                "Dagster run, reported to it after)"))
                    source_state.offer_listing(state)   # the documents stage lists nothing again
                    try:
                        if why_not:
                            result = job.execute(key)
                            ok, error = result.success, None if result.success else _first_error(result)
                            refused = not ok and _failed_on_config(result)
                        else:
                            ok, error, refused, coverage[key] = _direct(cfg, key, run)
                    finally:
                        source_state.offer_listing(None)
                    if ok and not run.stopping and guard.last_unreachable() is None:
                        with _connect(cfg) as conn:   # what the next run compares
                            source_state.record_if_complete(conn, state, coverage.get(key))
                if run.stopping:
                    break
                if guard.last_unreachable() is not None:
                    raise guard.last_unreachable()   # one line, exit 4 (main)
                if not ok:
                    failures.append((key, error))
                    config_failed = config_failed or refused
                run.done.append(key)
                run.current = None
        finally:
            progress_mod.set_current(None)
            progress_mod.set_steps_in_process(False)
            job.close()
    if run.stopping:
        run.finish()   # one line, exit 130/143
    with _connect(cfg) as conn:
        from kb_assets.pipeline import vector_index_build

        # the vector index of the space in use: a background build that was killed starts again (cheap when
        # all is well); --wait-index waits for it
        vector_index = vector_index_build.resume(conn)
        if vector_index == "building" and args.wait_index:
            vector_index = vector_index_build.wait_ready(conn)
        elif vector_index == "building" and not args.quiet:
            console.print("kb index: the vector index is building in the background; queries scan every vector "
                          "until it is ready (correct, slower). `kb status` shows it; --wait-index waits.")
        elapsed = time.perf_counter() - started
        from kb_assets.store.status import source_status

        rows = index_run.own_figures(source_status(conn, keys, config=cfg, coverage=coverage))  # this run's only
        for r in rows:
            r["skipped_run"] = r["source"] in skipped_runs
            r["runner"] = runners.get(r["source"])
            if r["skipped_run"]:
                r["last_run"] = _unchanged_figures(r)
        from kb_assets.guards import glob_warnings

        warnings = glob_warnings(conn, cfg, keys)
    if args.json:
        print(json.dumps({"sources": [_run_summary(r) for r in rows], "seconds": round(elapsed, 2),
                          "vector_index": vector_index,   # ready | building | missing | null (no space yet)
                          "failures": [{"source": k, "error": e} for k, e in failures],
                          "warnings": warnings}, indent=2, default=str))
    elif not args.quiet:
        _print_index_summary(_console(), rows, elapsed)
    for w in warnings:
        console.print(f"[yellow]warning:[/yellow] {w}")
    for key, err in failures:
        from rich.markup import escape

        # "sources[notes].max_files" is not markup; a configuration error needs no class name before it
        err = err.split(": ", 1)[1] if err.startswith(("kb_assets.config.ConfigError: ",
                                                      "kb_assets.sources.roots.TooManyFiles: ")) else err
        console.print(f"[red]kb index: source {key!r} failed:[/red] {escape(err)}", soft_wrap=True)  # one line
    return EXIT_CONFIG if config_failed else 1 if failures else 0


def _direct(cfg, key: str, run) -> tuple[bool, str | None, bool, dict | None]:
    """Index a small change of the source without a Dagster run (pipeline/direct_run.py) and store the run
    for the `kb_direct_runs` sensor. (ok, error line, a configuration refusal, the run's chunk coverage)."""
    from kb_assets.config import ConfigError
    from kb_assets.pipeline import cancel, direct_run, guard
    from kb_assets.pipeline.progress import current
    from kb_assets.sources.roots import config_error_names

    try:
        done = direct_run.run_source(cfg, key, progress=current())
    except cancel.Cancelled:
        if run.stopping:
            return False, None, False, None  # the caller stops with its one line
        raise
    except Exception as exc:                 # noqa: BLE001 - one line, as a failed Dagster run gives
        if guard.last_unreachable() is not None:
            return False, None, False, None  # exit 4 (the caller raises it)
        refused = isinstance(exc, ConfigError) or type(exc).__name__ in config_error_names()
        return False, str(exc) if refused else f"{type(exc).__name__}: {exc}", refused, None
    with _connect(cfg) as conn:
        direct_run.record(conn, done)
    return True, None, False, done.coverage


def _unchanged_figures(row: dict) -> dict:
    """The stage figures of a source reported unchanged without a run: the same keys a run reports, with
    nothing done and every document unchanged (JSON readers of `this_run` see no difference in shape)."""
    key = row["source"]
    return {
        "documents": {"source": key, "listed": row["documents"] + row["skipped"], "new": 0, "changed": 0,
                      "unchanged": row["documents"], "deleted": 0, "skipped": 0, "skipped_total": row["skipped"],
                      "skip_reasons": row["skip_reasons"], "commit": row["indexed_commit"], "complete": True,
                      "read_errors": 0, "seconds": 0.0},
        "chunks": {"source": key, "documents_chunked": 0, "chunks_written": 0, "chunks_removed": 0,
                   "chunks_kept": 0, "chunks_total": row["chunks"], "errors": 0, "seconds": 0.0},
        "embeddings": {"source": key, "model": row["embedding_model"], "dimension": row["embedding_dimension"],
                       "chunks_embedded": 0, "batches": 0, "tokens": 0, "reused": row["embedded"],
                       "missing_after": row["chunks"] - row["embedded"], "seconds": 0.0},
        "signposts": {"considered": row["documents"], "up_to_date": row["signposted"], "reused": 0,
                      "generated": 0, "failed": 0, "llm_calls": 0, "input_tokens": 0, "output_tokens": 0,
                      "estimated_cost_usd": 0.0, "seconds": 0.0},
    }


# A $DAGSTER_HOME nobody configured (no dagster.yaml): Dagster's default storages there (the UI pointed at it
# sees kb index's runs), without compute-log capture: for an in-process run it starts `tail -F` and a Python
# orphan watcher per stream (four processes), and kb's steps report through Dagster's events, not stdout.
# Its event log: Dagster's files, written through connections kept open (defs/cli_event_log.py). A configured
# home (its dagster.yaml) is used as it is.
# Telemetry off as in the repository's dagster.yaml (it appends a line to logs/event.log per step).
_UNCONFIGURED_HOME = {"compute_logs": {"module": "dagster._core.storage.noop_compute_log_manager",
                                       "class": "NoOpComputeLogManager"},
                      "telemetry": {"enabled": False}}


def _cli_instance(dg):
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        return dg.DagsterInstance.ephemeral()
    if os.path.exists(os.path.join(os.path.expanduser(home), "dagster.yaml")):
        return dg.DagsterInstance.get()          # the user's instance, as configured
    home = os.path.expanduser(home)
    events = {"event_log_storage": {"module": "kb_assets.defs.cli_event_log", "class": "HeldSqliteEventLogStorage",
                                    "config": {"base_dir": os.path.join(home, "history", "runs", "")}}}
    return dg.DagsterInstance.local_temp(tempdir=home, overrides={**_UNCONFIGURED_HOME, **events})


class _DagsterJob:
    """The `kb_index` job of the definitions, run in-process; built on the first source that needs a run."""

    def __init__(self, url: str):
        self._url = url
        self._job = None

    def close(self) -> None:
        """Let the instance close its storages (sqlite: the runs' WAL checkpointed, not left beside the files)."""
        instance, self._instance = getattr(self, "_instance", None), None
        if instance is not None:
            try:
                instance.dispose()
            except Exception:    # closing is best effort: the runs are committed already
                pass

    def execute(self, key: str):
        from kb_assets.pipeline import cancel
        from kb_assets.store.locks import source_lock

        if self._job is None:
            import dagster as dg

            from kb_assets.definitions import defs

            logging.getLogger("dagster").setLevel(logging.ERROR)
            definitions = defs() if callable(defs) else defs
            self._job = definitions.resolve_job_def("kb_index")
            # Two first runs on one fresh $DAGSTER_HOME raced on its sqlite schema (alembic "more than one
            # head"): the instance is opened under a lock of our database.
            with source_lock(self._url, ":dagster-instance", check=cancel.check):   # ":" is no source key
                self._instance = _cli_instance(dg)
        return self._job.execute_in_process(partition_key=key, instance=self._instance, raise_on_error=False,
                                            run_config={"loggers": {"console": {"config": {"log_level": "ERROR"}}}})


def _failed_on_config(result) -> bool:
    """True when a step failed on a ConfigError (e.g. a listing past max_files)."""
    from kb_assets.sources.roots import config_error_names

    for event in result.all_events:
        err = getattr(event.event_specific_data, "error", None) if event.is_failure else None
        while err is not None:
            if err.cls_name in config_error_names():
                return True
            err = getattr(err, "cause", None)
    return False


def _first_error(result) -> str:
    for event in result.all_events:
        if event.is_failure and event.event_specific_data is not None:
            err = getattr(event.event_specific_data, "error", None)
            if err is not None:
                cause = err
                while getattr(cause, "cause", None) is not None:
                    cause = cause.cause
                return cause.message.strip().splitlines()[-1] if cause.message else str(cause)
    return "run failed (see Dagster logs)"


def _run_summary(row: dict) -> dict:
    last = row.get("last_run") or {}
    return {
        "source": row["source"], "documents": row["documents"], "chunks": row["chunks"],
        "embedded": row["embedded"], "signposted": row["signposted"], "skipped": row["skipped"],
        "skip_reasons": row["skip_reasons"], "indexed_commit": row["indexed_commit"],
        "this_run": {stage: last.get(stage, {}) for stage in ("documents", "chunks", "embeddings", "signposts",
                                                              "search_index")},
        "skipped_run": bool(row.get("skipped_run")),   # nothing changed since the last complete run: no run
        "runner": row.get("runner"),   # "dagster" (the job) | "direct" (a small change, no Dagster run) | null
    }


def _print_index_summary(console, rows, elapsed) -> None:
    from rich.table import Table

    t = Table(title=f"kb index — {elapsed:.1f} s", title_justify="left")
    for col in ("source", "new", "changed", "unchanged", "deleted", "skipped", "chunks", "embedded now",
                "signposted now", "documents", "commit"):
        t.add_column(col, justify="right" if col not in ("source", "commit") else "left")
    for r in rows:
        last = r.get("last_run") or {}
        d = last.get("documents", {})
        e = last.get("embeddings", {})
        s = last.get("signposts", {})
        t.add_row(r["source"], str(d.get("new", 0)), str(d.get("changed", 0)), str(d.get("unchanged", 0)),
                  str(d.get("deleted", 0)), str(r["skipped"]), str(r["chunks"]), str(e.get("chunks_embedded", 0)),
                  str(s.get("generated", 0)), str(r["documents"]), (r["indexed_commit"] or "-")[:10])
    console.print(t)


# ---------------------------------------------------------------- status
def cmd_status(args) -> int:
    cfg = _load(args, need_sources=False)
    with _connect(cfg) as conn:
        from kb_assets.store.status import status_report

        report = status_report(conn, [s.key for s in cfg.sources], config=cfg)   # also GET /api/v1/status
    rows, never, warnings = report["sources"], report["never_indexed"], report.get("warnings", [])
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    console = _console()
    from rich.table import Table

    t = Table(title="kb status", title_justify="left")
    for col in ("source", "kind", "documents", "chunks", "embedded", "signposted", "skipped", "indexed commit",
                "fresh", "last run"):
        t.add_column(col)
    for r in rows:
        fresh = {True: "yes", False: "[yellow]behind HEAD[/yellow]", None: "-"}[r["fresh"]]
        t.add_row(r["source"], r["kind"], str(r["documents"]), str(r["chunks"]), str(r["embedded"]),
                  str(r["signposted"]), str(r["skipped"]), (r["indexed_commit"] or "-")[:10], fresh,
                  (r["last_run_at"] or "-")[:19])
    console.print(t)
    for r in rows:
        if r["skip_reasons"]:
            reasons = ", ".join(f"{k}: {v}" for k, v in sorted(r["skip_reasons"].items()))
            console.print(f"{r['source']}: skipped — {reasons}")
            for s in r["skipped_files"][: args.show_skipped]:
                from rich.markup import escape

                from kb_assets.sources.safe_names import printable

                # one line per file even for a name with a newline; "[x]" in a name is not markup
                console.print(f"    {escape(printable(s['path']))}  [dim]{s['reason']}: "
                              f"{escape(printable(s['detail'] or ''))}[/dim]")
        for f in r["signpost_failures"][:10]:
            console.print(f"{r['source']}: signpost failing — {f}")
    for k in never:
        console.print(f"{k}: configured, never indexed (run `kb index --source {k}`)")
    for w in warnings:
        console.print(f"[yellow]warning:[/yellow] {w}")
    if rows and rows[0]["embedding_model"] and rows[0].get("vector_index_state") == "building":
        console.print("[yellow]vector index building[/yellow] in the background: recall scans every vector "
                      "until it is ready (correct, slower)")
    elif rows and rows[0]["embedding_model"] and not rows[0]["vector_index"]:
        console.print("[yellow]vector index missing[/yellow]: recall scans every vector until `kb index` "
                      "rebuilds it (kb_search_index)")
    return 0


# ---------------------------------------------------------------- search (plain chunk search)
def cmd_search(args) -> int:
    cfg = _load(args, need_sources=False)
    from kb_assets.query.chunk_search import search_chunks
    from kb_assets.query.inputs import MAX_SEARCH_LIMIT, check_limit, check_query_text

    check_query_text(args.query)                                   # before the database starts
    check_limit("--limit", args.limit, lowest=1, highest=MAX_SEARCH_LIMIT)
    with _connect(cfg) as conn:
        hits = search_chunks(conn, cfg, args.query, limit=args.limit)
    if args.json:
        print(json.dumps({"query": args.query, "chunks": hits}, indent=2, default=str))
        return 0
    from rich.markup import escape

    from kb_assets.sources.safe_names import printable

    console = _console()
    for h in hits:
        console.print(f"[bold]{h['score']:.4f}[/bold] {escape(printable(h['source'] + ':' + h['path']))}:"
                      f"{h['start_line']}-{h['end_line']}  [dim]{escape(printable(h['heading']))}[/dim]")
        console.print("    " + escape(printable(h["text"][:240].replace("\n", " "))))
    return 0


# ---------------------------------------------------------------- recall / show / eval / plan
def _filters(args) -> dict:
    return {"source": args.source, "kind": args.kind, "tag": args.tag, "path_prefix": args.path_prefix,
            "since": args.since, "until": args.until}


def cmd_recall(args) -> int:
    from kb_assets.query import recall

    cfg = _load(args, need_sources=False)
    from kb_assets.guards import check_recall_filters

    check_recall_filters(cfg, args.kind, args.source)
    from kb_assets.serving.client import cmd_recall_remote, server_url

    if server_url(cfg):   # a running `kb serve` (KB_SERVER / serve.url): same output, no model load here
        return cmd_recall_remote(args, cfg, server_url(cfg))
    common = dict(config=cfg, limit=args.limit, code_limit=args.code_limit, include_passage=args.passage,
                  **_filters(args))
    if args.queries:
        if args.query:
            raise ConfigError("(command line)", "QUERY", "given together with --queries", "use one or the other")
        from kb_assets.query.batch import run_batch

        run_batch(args.queries, recall, common, as_json=args.json)   # an answer or an error line per line
        return 0
    if not args.query:
        raise ConfigError("(command line)", "QUERY", "missing", "give a query, several queries, or --queries FILE")
    result = recall(args.query if len(args.query) > 1 else args.query[0], **common)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        print(result.render_text())
    return 0


def cmd_show(args) -> int:
    from kb_assets.query import show

    from kb_assets.query import render_show

    cfg = _load(args, need_sources=False)
    doc = show(args.id, config=cfg)
    print(json.dumps(doc, indent=2, default=str) if args.json else render_show(doc))
    return 0


def cmd_eval(args) -> int:
    from kb_assets.query.evaluate import run_eval

    cfg = _load(args, need_sources=False)
    report = run_eval(cfg, queries_path=args.queries, qrels_path=args.qrels, modes=args.mode,
                      doc_key=args.doc_key)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        import pandas as pd

        print(pd.DataFrame(report["metrics"]).T.round(4).to_string())
    return 0


def cmd_plan(args) -> int:
    from kb_assets.plan import plan

    cfg = _load(args)
    report = plan(cfg)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    import pandas as pd

    print(pd.DataFrame(report["sources"]).to_string(index=False))
    print(f"\nestimated total: ${report['total_usd']:.4f}  "
          f"(embedder {cfg.embedder}, signposter {cfg.signposter}; prices are settings in kb.yaml)")
    return 0


def cmd_mcp(args) -> int:
    from kb_assets.serving.mcp import run_stdio

    run_stdio(_load(args, need_sources=False))
    return 0


# ---------------------------------------------------------------- projections (kb_assets/projections/commands.py)
def cmd_tier(args) -> int:
    from kb_assets.projections.commands import cmd_tier as run

    return run(args, _load(args, need_sources=False))


def cmd_tags(args) -> int:
    from kb_assets.projections.commands import cmd_tags as run

    cfg = _load(args, need_sources=False)
    with _connect(cfg) as conn:
        return run(args, cfg, conn)


def cmd_related(args) -> int:
    from kb_assets.projections.commands import cmd_related as run

    cfg = _load(args, need_sources=False)
    with _connect(cfg) as conn:
        return run(args, cfg, conn)


class _Version(argparse.Action):
    """`kb --version`: the package's version and a digest of the installed code (an editable install's version
    never changes; the digest says which code ran, e.g. in a benchmark's record). Computed only when asked."""

    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, help="print kb's version and code digest, then exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib.metadata import PackageNotFoundError, version

        from kb_assets.pipeline.source_state import code_version

        try:
            v = version("kb_assets")
        except PackageNotFoundError:
            v = "unknown"
        print(f"kb {v} (code {code_version()})")     # stdout, as argparse's own version action
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kb", description="kb_assets: a knowledge layer for AI coding agents")
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="verb", required=True)

    def add(name, fn, help_):
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("--config", help="kb.yaml (default: $KB_CONFIG, ./kb.yaml, else this git repository)")
        sp.set_defaults(fn=fn)
        return sp

    sp = add("index", cmd_index, "index the configured sources (the Dagster assets in-process; a small change "
                                 "directly, reported to Dagster after)")
    sp.add_argument("--source", action="append", help="only this source key (repeatable)")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--quiet", action="store_true")
    sp.add_argument("--no-wait", action="store_true",
                    help="if another run is indexing a source, exit 3 naming it instead of waiting")
    sp.add_argument("--force", action="store_true",
                    help="run every source, also those unchanged since their last complete run")
    sp.add_argument("--dagster", action="store_true",
                    help="run each source that has work through the Dagster job, also a small change "
                         "(which kb index otherwise indexes directly and reports to Dagster afterwards)")
    sp.add_argument("--wait-index", action="store_true",
                    help="wait for a vector index being built in the background (a large first load) before "
                         "exiting; queries are correct meanwhile, only slower")

    sp = add("status", cmd_status, "per-source counts, skips with reasons, freshness")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--show-skipped", type=int, default=10, help="skipped files listed per source")

    sp = add("search", cmd_search, "plain hybrid chunk search")
    sp.add_argument("query")
    sp.add_argument("--limit", type=int, default=10)
    sp.add_argument("--json", action="store_true")

    sp = add("recall", cmd_recall, "signposts for a question: documents and code, budgeted")
    sp.add_argument("query", nargs="*", help="one or more queries (their union is returned)")
    sp.add_argument("--queries", help="JSONL file of {\"id\", \"query\"}: one JSON line out per query")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--limit", type=int)
    sp.add_argument("--code-limit", type=int)
    sp.add_argument("--passage", action="store_true", help="add the best matching passage to each record")
    sp.add_argument("--source", action="append")
    sp.add_argument("--kind", action="append")
    sp.add_argument("--tag", action="append")
    sp.add_argument("--path-prefix")
    sp.add_argument("--since", help="YYYY-MM-DD")
    sp.add_argument("--until", help="YYYY-MM-DD")

    sp = add("show", cmd_show, "the whole document behind a kb:<id>")
    sp.add_argument("id")
    sp.add_argument("--json", action="store_true")

    sp = add("eval", cmd_eval, "retrieval quality: nDCG@10, Recall@1/5/10/100, MRR@10")
    sp.add_argument("--queries", required=True)
    sp.add_argument("--qrels", required=True)
    sp.add_argument("--mode", action="append", choices=["hybrid", "vector", "keyword"])
    sp.add_argument("--doc-key", default="stem", choices=["stem", "path", "id"],
                    help="how qrels corpus ids name documents (stem: file name without extension)")
    sp.add_argument("--json", action="store_true")

    add("mcp", cmd_mcp, "MCP server on stdio (tools recall/show/search/status): claude mcp add kb -- kb mcp")

    sp = add("plan", cmd_plan, "estimate files, chunks, tokens and dollars before anything is spent")
    sp.add_argument("--json", action="store_true")

    from kb_assets.serving.commands import add_parsers as add_serving_parsers

    add_serving_parsers(add)   # kb serve, kb token create|list|revoke

    sp = add("tier", cmd_tier, "print a projection: 0 the index, 1 [TYPE] per type (code: the code maps), "
                               "2 kb:<id> one document, 3 relations")
    sp.add_argument("tier", choices=["0", "1", "2", "3"])
    sp.add_argument("type", nargs="?", help="tier 1: document type (adr, doc, ..., code); tier 2: kb:<id>")

    sp = add("tags", cmd_tags, "tags in use, their by-tag files, and tags outside the kb.yaml vocabulary")
    sp.add_argument("--json", action="store_true")

    sp = add("related", cmd_related, "relations of a document (supersedes, references, touches, ...)")
    sp.add_argument("id", help="kb:<source>/<path>")
    sp.add_argument("--depth", type=int, default=1, help="hops to follow (default 1)")
    sp.add_argument("--json", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import warnings

    # platformdirs (via pgserver) warns on every start when XDG_RUNTIME_DIR is unset: noise, not news.
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    args = build_parser().parse_args(argv)
    if args.verb in ("recall", "show", "search", "status"):
        from kb_assets.store import linger

        linger.enable()   # the embedded database outlives this call for KB_DB_LINGER s (store/linger.py)
    try:
        rc = args.fn(args) or 0
        if args.verb == "index" and os.path.basename(sys.argv[0]) == "kb":
            from kb_assets.index_run import exit_without_teardown

            exit_without_teardown(rc)    # the console script's process ends here (main() called in-process returns)
        return rc
    except ConfigError as exc:
        print(f"kb: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except Exception as exc:
        from kb_assets.query import QueryError

        if isinstance(exc, QueryError):   # bad date, unknown id, index built with another model ...
            from kb_assets.query import QueryInputError

            print(f"kb {args.verb}: {exc}", file=sys.stderr)
            return EXIT_CONFIG if isinstance(exc, QueryInputError) else 1   # bad input: exit 2, as a config mistake
        from kb_assets.index_run import exit_code_for

        code = exit_code_for(exc)   # 3: source busy (--no-wait), 4: database unreachable
        if code is not None:
            print(f"kb {args.verb}: {exc}", file=sys.stderr)
            return code
        raise
    except KeyboardInterrupt:
        print("kb: interrupted — the index keeps its last consistent state; re-run to finish", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
