"""`kb tier`, `kb tags`, `kb related`: the projections from the command line (cli.py holds only the parser lines).

`kb tier` reads the files the projections stage wrote (no database start: what an agent calls first must be
cheap); `kb tags` and `kb related` read the index.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


class ProjectionsMissing(Exception):
    """No projection files yet (str(): what to run)."""


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProjectionsMissing(f"{path} does not exist: run `kb index` (the kb_projections stage writes it)") from None


def tier_text(cfg, tier: int, type_: str | None = None) -> str:
    root = cfg.projections_path()
    if tier == 0:
        return _read(root / "index.dsl")
    if tier == 1:
        if not type_:
            types = sorted(p.stem for p in root.glob("*.dsl") if p.stem not in ("index", "relates"))
            if not types and not (root / "code").is_dir():
                raise ProjectionsMissing(f"no T1 files in {root}: run `kb index`")
            lines = ["# kb T1 types: `kb tier 1 <type>` (code: the code maps)"]
            for t in types:
                n = sum(1 for ln in _read(root / f"{t}.dsl").splitlines() if ln and not ln.startswith("#"))
                lines.append(f"{t} | {n} entries | {root / (t + '.dsl')}")
            if (root / "code").is_dir():
                lines.append(f"code | {len(list((root / 'code').glob('*.dsl')))} sources | {root / 'code'}")
            return "\n".join(lines) + "\n"
        if type_ == "code":
            maps = sorted((root / "code").glob("*.dsl"))
            if not maps:
                raise ProjectionsMissing(f"no code maps in {root / 'code'}: index a code source with `kb index`")
            return "".join(_read(p) for p in maps)
        path = root / f"{type_}.dsl"
        if not path.exists():
            have = sorted(p.stem for p in root.glob("*.dsl") if p.stem not in ("index", "relates"))
            raise ProjectionsMissing(f"no T1 file for type {type_!r} in {root}"
                                     + (f": types are {', '.join(have + ['code'])}" if have else ": run `kb index`"))
        return _read(path)
    if tier == 3:
        if type_ == "code":
            return tier_text(cfg, 1, "code")
        return _read(root / "relates.dsl")
    raise ProjectionsMissing("tier 2 is one document at a time: `kb show kb:<id>`")


def cmd_tier(args, cfg) -> int:
    if args.tier == "2":
        if not args.type:
            print("kb tier: tier 2 is one document at a time: `kb tier 2 kb:<id>` (or `kb show kb:<id>`)",
                  file=sys.stderr)
            return 1
        from kb_assets.query import render_show, show

        print(render_show(show(args.type, config=cfg)))
        return 0
    try:
        text = tier_text(cfg, int(args.tier), args.type)
    except ProjectionsMissing as exc:
        print(f"kb tier: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


def cmd_tags(args, cfg, conn) -> int:
    from kb_assets.projections.report import tags_report

    report = tags_report(conn, cfg)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    head = "governed by kb.yaml `tags:`" if report["governed"] else "no vocabulary in kb.yaml: every tag is used"
    print(f"# kb tags ({head}): tag | documents | file")
    for t, info in report["tags"].items():
        print(f"{t} | {info['documents']} | {info['file']}")
    for t in report["unused"]:
        print(f"{t} | 0 | (in the vocabulary, no document uses it)")
    if report["outside"]:
        print(f"# {len(report['outside'])} tags outside the vocabulary (no by-tag file; add them or their aliases):")
        for t, n in report["outside"].items():
            print(f"{t} | {n}")
    return 0


def cmd_related(args, cfg, conn) -> int:
    from kb_assets.query import QueryError, parse_id
    from kb_assets.query.relations import related

    src, path = parse_id(args.id)
    if args.depth < 1:
        raise QueryError("--depth must be at least 1")
    out = related(conn, src, path, depth=args.depth)
    if not out["found"]:
        raise QueryError(f"no document {out['id']} in the index (ids as printed by kb recall / kb tier 0)")
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"# {out['id']}: depth | from | kind | to   (\"?\": not in the index)")
    for e in out["edges"]:
        to = e["to"] if e["resolved"] else "?" + e["to"]
        print(f"{e['depth']} | {e['from']} | {e['kind']} | {to}")
    if not out["edges"]:
        print("(no relations)")
    return 0
