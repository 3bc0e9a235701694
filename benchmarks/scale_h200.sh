#!/usr/bin/env bash
# Issue #30's measurements on one H200 in one call (<= 540 s), with reduced budgets: the nanoGPT
# race on the pyenv corpus, 1B MFU with the measured matmul ceiling and profile summaries, FP8
# (1b-dense bf16 vs fp8 tensorwise / rowwise) and MoD at iso-FLOPs. Each part has its own timeout,
# so one overrun leaves the others their time; results land in $OUT as JSON (+ one log).
# Needs, carried beside the working tree: .whl/ with torchao-0.17.0 (built for torch 2.11) and the
# cp312 wheels of ats-data's dependencies the image lacks (mwparserfromhell, xxhash), and .corpus/tok32k.json (the 32k BPE, trained by `nanogpt_race.py --make-tokenizer`).
# Run from the repository root: bash benchmarks/scale_h200.sh
set -u -o pipefail
OUT=${OUT:?set OUT to the results folder}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
PYTHONPATH=$(ls -d "$PWD"/packages/*/src | paste -sd:):/tmp/site
export PYTHONPATH
B=benchmarks
DATA=/tmp/pyenv32k
LOG=$OUT/scale.log
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$LOG"
git log -1 --format='commit %H' 2>/dev/null | tee -a "$LOG"
part() {  # part NAME SECONDS CMD...: run with a timeout, log, keep going
  local name=$1 secs=$2
  shift 2
  echo "=== $name (timeout ${secs}s) $*" | tee -a "$LOG"
  local t0=$SECONDS
  timeout "$secs" "$@" 2>&1 | grep -v -e '^step ' -e '^train ' | tee -a "$LOG"
  echo "=== $name rc=$? in $((SECONDS - t0)) s" | tee -a "$LOG"
}
part race 245 python3 $B/nanogpt_race.py --data $DATA --source pyenv --max-mb 200 \
  --tokenizer .corpus/tok32k.json --budget 40 --evals 4 --eval-tokens 131072 --out "$OUT/race.json"
part mfu 80 python3 $B/mfu.py --preset 1b-dense,1b-moe --kernels auto --seq-len 2048 --batch 8 \
  --warmup 3 --steps 8 --ceiling --profile /tmp/prof
for f in /tmp/prof/*/summary.txt; do
  [ -f "$f" ] && cp "$f" "$OUT/prof_$(basename "$(dirname "$f")").txt"
done
part fp8 105 python3 $B/fp8.py --data $DATA --steps 30 --warmup 8 --batch 4 --seq-len 2048 \
  --eval-tokens 65536 --out "$OUT/fp8.json"
part mod 70 python3 $B/mod_isoflops.py --data $DATA --size 124m --dense-steps 200 \
  --eval-tokens 131072 --out "$OUT/mod.json"
