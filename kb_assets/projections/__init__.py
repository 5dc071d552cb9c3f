"""Projections: the index rendered ahead of time as small text files an agent reads instead of searching.

    T0  index.dsl          one line per entry: id | type | title | path | status (code: see code/)
    T1  <type>.dsl         per document type, one line per entry with a one-line "use when"
        by-tag/<tag>.dsl   entries per tag, tags governed by kb.yaml `tags:` (vocabulary.py)
    T2  `kb show kb:<id>`  the whole document (not a file)
    T3  relates.dsl        the relations graph; code/<source>.dsl  one line per code file (a repository map)

Rendering (render.py) is a pure function of the entries loaded from the database (load.py); writing
(files.py) touches a file only when its bytes change, atomically. The stage that runs it all is
kb_assets/pipeline/projections.py; the contract for agents is docs/PROJECTIONS.md.
"""
from kb_assets.projections.files import FileSync, write_if_changed
from kb_assets.projections.vocabulary import TagVocabulary

__all__ = ["FileSync", "TagVocabulary", "write_if_changed"]
