-- Relations between documents (issue 13 §2): supersedes, superseded_by, amends, references, touches.
-- One row per edge. `target` is the reference as the document wrote it (a root-relative path, "ADR-37",
-- "PEP-440", "kb:<source>/<path>", a code path); `target_document_id` is the document it resolved to, NULL
-- while unresolved (kept and counted, resolved again on each projections run: the target may be indexed later).
-- origin: 'document' (written by the documents stage, in the document's transaction), 'inverse' (the other
-- direction of a resolved supersedes / superseded_by / amends edge), 'signpost' (touches from artifacts).
CREATE TABLE IF NOT EXISTS relations (
    id                  bigserial PRIMARY KEY,
    document_id         bigint NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    kind                text NOT NULL CHECK (kind IN ('supersedes', 'superseded_by', 'amends', 'amended_by',
                                                      'references', 'touches')),
    target              text NOT NULL,
    target_document_id  bigint REFERENCES documents(id) ON DELETE SET NULL,
    origin              text NOT NULL DEFAULT 'document' CHECK (origin IN ('document', 'inverse', 'signpost')),
    UNIQUE (document_id, kind, target, origin)
);
CREATE INDEX IF NOT EXISTS relations_target_doc_idx ON relations (target_document_id);
CREATE INDEX IF NOT EXISTS relations_unresolved_idx ON relations (document_id) WHERE target_document_id IS NULL;

-- Backfill from what the readers already stored in documents.meta (links written in the text of non-decision
-- documents come with the document's next read; see kb_assets/pipeline/relations.py edges_for).
INSERT INTO relations (document_id, kind, target, origin)
SELECT d.id, m.edge, v.t, 'document'
FROM documents d
CROSS JOIN (VALUES ('superseded_by', 'superseded_by'), ('supersedes', 'supersedes'), ('amends', 'amends'),
                   ('updates', 'amends'), ('amended_by', 'amended_by')) AS m(key, edge)
CROSS JOIN LATERAL jsonb_array_elements_text(
    CASE WHEN jsonb_typeof(d.meta -> m.key) = 'array' THEN d.meta -> m.key ELSE '[]'::jsonb END) AS v(t)
WHERE d.status = 'active' AND v.t <> '' AND v.t <> d.path
ON CONFLICT DO NOTHING;
INSERT INTO relations (document_id, kind, target, origin)
SELECT d.id, 'references', v.t, 'document'
FROM documents d
CROSS JOIN LATERAL jsonb_array_elements_text(
    CASE WHEN jsonb_typeof(d.meta -> 'references') = 'array' THEN d.meta -> 'references' ELSE '[]'::jsonb END) AS v(t)
WHERE d.status = 'active' AND v.t <> '' AND v.t <> d.path
  AND NOT EXISTS (SELECT 1 FROM relations r WHERE r.document_id = d.id AND r.target = v.t)
ON CONFLICT DO NOTHING;
