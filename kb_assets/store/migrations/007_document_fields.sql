-- The one parse of each document, as columns (issue 13 §1): what the readers read from front matter and the
-- document's own header, normalised once by the documents stage (kb_assets/pipeline/document_fields.py), so
-- the query filters in SQL over the whole index instead of re-reading meta. `status` is taken (active /
-- skipped): the document's own lifecycle is doc_status (canonical word, sources/decisions.normalize_status)
-- beside doc_status_raw (the document's own word).
-- Dates: created / updated as the document states them; when it states none, the git commit date (HEAD mode)
-- or the file's mtime (worktree mode) fills both, and date_source says which: front_matter | document |
-- file_name | git | transcript | work_item | commit | mtime. `filter_date` (updated, else created) is what
-- --since / --until / filter[date_range] compare.
-- fields_version: the version of the rules that filled the row; rows of an older version (every row right
-- after this migration) are refilled from their stored meta by the next documents run, no file read and
-- nothing re-embedded.
ALTER TABLE documents ADD COLUMN IF NOT EXISTS doc_status text;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS doc_status_raw text;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS created date;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS updated date;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS date_source text;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS tags text[] NOT NULL DEFAULT '{}';
ALTER TABLE documents ADD COLUMN IF NOT EXISTS fields_version smallint;
CREATE INDEX IF NOT EXISTS documents_filter_date_idx ON documents ((coalesce(updated, created)));
CREATE INDEX IF NOT EXISTS documents_tags_idx ON documents USING gin (tags);
