-- The documents stage's block scan, stored (issue 13 §1, parse once): for a markdown-shaped document the
-- block structure markdown-it's block rules give (chunking/markdown.block_structure: ATX / setext headings
-- with levels and titles, fence / indented code / HTML block spans, in 0-based lines of the stored text) over
-- the chunker's view of it (front matter blanked, "fm" lines; lone CRs blanked, "cr"), so the chunks stage and
-- the extractive signposter read it instead of scanning the text again. NULL: not a markdown document, or a
-- row written before this migration (its readers scan the text, as before; the next documents run fills it
-- from the stored text: nothing re-read, re-chunked or re-embedded).
ALTER TABLE documents ADD COLUMN IF NOT EXISTS blocks jsonb;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS blocks_version smallint;
