#!/bin/bash
# One full `kb index` in the environment of peerbench's kb adapter, on a fresh database, under /usr/bin/time -v
# (no profiler): the full pass alone, without the harness's end-state probe (~2.5 min per pass at 3,000 docs).
#   bench/peerbench_fullpass.sh /tmp/peerbench/runs/kb-synth-fake /tmp/peerbench/pg pb_kb_try1
# RUN: a kb chain's run folder (its kb.yaml, corpus, dagster_home); PG: the harness's server socket folder.
RUN=$1; PG=$2; DB=$3; OUT=${OUT:-/tmp/$DB}
HERE=$(cd "$(dirname "$0")" && pwd)
psql "postgresql://postgres@/postgres?host=$PG" -qc "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB" >/dev/null
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PEERBENCH_STATS=$RUN/stats-$DB.json PEERBENCH_FAKE_SLEEP=0.002 PEERBENCH_EMBEDDER=fake
export PYTHONPATH=/work/shared/peerbench/kb_hook DAGSTER_HOME=$RUN/dagster_home
export KB_DATABASE_URL="postgresql://postgres@/$DB?host=$PG"
cd "$RUN" && uptime
/usr/bin/time -v -o $OUT.time ${KB_CMD:-$HERE/../.venv/bin/kb} index --config "$RUN/kb.yaml" --json > $OUT.json 2> $OUT.err
grep -E "Elapsed|Maximum resident|User time|System time" $OUT.time
python3 - "$OUT.json" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))["sources"][0]["this_run"]
print("stage seconds:", {k: v.get("seconds") for k, v in run.items() if isinstance(v, dict)})
PY
cat $RUN/stats-$DB.json.* 2>/dev/null; echo; rm -f $RUN/stats-$DB.json.*
uptime
