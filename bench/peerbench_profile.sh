#!/bin/bash
# One `kb index` in the environment of peerbench's kb adapter (/work/shared/peerbench bench.py KbPeer.env), under
# py-spy (raw collapsed stacks) and /usr/bin/time -v. Needs py-spy in /tmp/peerbench/venv-h (pip install py-spy).
#   bench/peerbench_profile.sh /tmp/peerbench/runs/kb-synth-fake /tmp/prof-nochange [VAR=value ...]
#   python3 bench/pyspy_shares.py /tmp/prof-nochange.raw store_event DagsterInstance load_model sync_documents
RUN=$1; OUT=$2; shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PEERBENCH_STATS=$RUN/stats-prof.json PEERBENCH_FAKE_SLEEP=0.002 PEERBENCH_EMBEDDER=fake
export PYTHONPATH=/work/shared/peerbench/kb_hook DAGSTER_HOME=$RUN/dagster_home
export KB_DATABASE_URL=${KB_DATABASE_URL:-$(grep database_url $RUN/kb.yaml | sed "s/database_url: //; s/\"//g")}
for kv in "$@"; do export "$kv"; done
cd $RUN
uptime
/usr/bin/time -v -o $OUT.time /tmp/peerbench/venv-h/bin/py-spy record --subprocesses -r 50 -f raw -o $OUT.raw -- ${KB_CMD:-$HERE/../.venv/bin/kb} index --config $RUN/kb.yaml > $OUT.log 2>&1
grep -E "Elapsed|Maximum resident|User time|System time" $OUT.time
cat $RUN/stats-prof.json.* 2>/dev/null; rm -f $RUN/stats-prof.json.*
uptime
