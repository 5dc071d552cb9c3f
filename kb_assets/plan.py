"""`kb plan`: what an index run would cost, before anything is spent.

A dry run of the free stages (listing, reading, redaction, chunking with the embedder's tokenizer) that
counts only the work still to pay for: chunk hashes without a vector in the configured space, and
documents without a signpost for the configured generator, model and prompt version.
"""
from __future__ import annotations

from kb_assets.config import KbConfig


def _known(conn, cfg: KbConfig, embedder, signposter):
    """Chunk hashes already embedded and document hashes already signposted (empty without a database)."""
    if conn is None:
        return set(), set()
    from kb_assets.store import spaces

    table = spaces.space_table(conn, embedder.model, embedder.dimension)
    embedded = set()
    if table:
        embedded = {r[0] for r in conn.execute(f'SELECT chunk_hash FROM "{table}"')}
    signposted = {r[0] for r in conn.execute(
        "SELECT content_hash FROM signposts WHERE generator = %s AND model = %s AND prompt_version = %s",
        (signposter.generator, signposter.model, signposter.prompt_version))}
    return embedded, signposted


def plan(cfg: KbConfig, conn=None) -> dict:
    from kb_assets.chunking import chunk_document
    from kb_assets.embedding import make_embedder
    from kb_assets.signposts import make_signposter
    from kb_assets.pipeline.signposts import estimate_signpost_tokens
    from kb_assets.sources.discovery import list_source
    from kb_assets.sources.readers import read_entry
    from kb_assets.sources.roots import TooManyFiles

    embedder = make_embedder(cfg)
    signposter = make_signposter(cfg)
    if conn is None:
        from kb_assets.store.db import connect, open_database

        with connect(open_database(cfg)) as own:
            embedded, signposted = _known(own, cfg, embedder, signposter)
    else:
        embedded, signposted = _known(conn, cfg, embedder, signposter)

    emb_price = cfg.voyage.price_per_million_tokens if cfg.embedder == "voyage" else 0.0
    llm = cfg.signposter == "gemini"
    in_price = cfg.gemini.price_input_per_million_tokens if llm else 0.0
    out_price = cfg.gemini.price_output_per_million_tokens if llm else 0.0
    rows = []
    for source in cfg.sources:
        if not source.enabled:
            continue
        root = cfg.source_root(source)
        try:
            listing = list_source(root, source)
        except TooManyFiles as exc:
            raise exc.with_config_path(cfg.config_path) from None
        files = documents = chunks = chunks_to_embed = emb_tokens = 0
        docs_to_signpost = sp_in = sp_out = 0
        skipped = len(listing.skips)
        seen_hashes: set[str] = set()
        for entry in listing.files:
            result = read_entry(root, entry, source)
            files += 1
            if not isinstance(result, list):
                skipped += 1
                continue
            for doc in result:
                documents += 1
                if doc.content_hash not in signposted:
                    docs_to_signpost += 1
                    if llm:
                        i, o = estimate_signpost_tokens(doc.text, doc.kind)
                        sp_in += i
                        sp_out += o
                pieces = chunk_document(doc, max_tokens=embedder.max_tokens, count_tokens=embedder.count_tokens)
                chunks += len(pieces)
                for c in pieces:
                    h = c.chunk_hash
                    if h in embedded or h in seen_hashes:
                        continue
                    seen_hashes.add(h)
                    chunks_to_embed += 1
                    emb_tokens += c.token_count
        cost = emb_tokens / 1e6 * emb_price + sp_in / 1e6 * in_price + sp_out / 1e6 * out_price
        rows.append({
            "source": source.key, "files": files, "skipped": skipped, "documents": documents, "chunks": chunks,
            "chunks_to_embed": chunks_to_embed, "embedding_tokens": emb_tokens,
            "documents_to_signpost": docs_to_signpost, "signpost_input_tokens": sp_in,
            "signpost_output_tokens": sp_out, "estimated_usd": round(cost, 4),
        })
    return {
        "embedder": {"kind": cfg.embedder, "model": embedder.model, "price_per_million": emb_price},
        "signposter": {"kind": cfg.signposter, "model": signposter.model,
                       "price_input_per_million": in_price, "price_output_per_million": out_price},
        "sources": rows,
        "total_usd": round(sum(r["estimated_usd"] for r in rows), 4),
    }
