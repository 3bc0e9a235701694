#!/usr/bin/env bash
# Issue #30's measurements on one H200, one device call each (<= 560 s), with reduced budgets:
#   bash benchmarks/scale_h200.sh              FP8 at 1B (bf16, fp8 tensorwise, fp8 rowwise), MoD
#                                              at iso-FLOPs (124m) and 1b-moe MFU with the measured
#                                              matmul ceiling and a profile summary
#   bash benchmarks/scale_h200.sh --race-only  the nanoGPT race on the pyenv corpus
# Each part has its own timeout, so one overrun leaves the others their time (worst case: 15 s of
# setup + the timeouts, 75 + 160 + 150 + 80 = 465 s); results land in $OUT as JSON, one log per
# part, and the last line printed is a compact JSON summary of the call.
# Needs, carried beside the working tree: .whl/ with torchao-0.17.0 (built for torch 2.11) and the
# cp312 wheels of ats-data's dependencies the image lacks (mwparserfromhell, xxhash), and
# .corpus/tok32k.json (the 32k BPE, trained by `nanogpt_race.py --make-tokenizer`).
# Run from the repository root.
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
part() {  # part NAME SECONDS CMD...: run with a timeout, log to $OUT/NAME.log too, keep going
  local name=$1 secs=$2
  shift 2
  echo "=== $name (timeout ${secs}s) $*" | tee -a "$LOG"
  local t0=$SECONDS
  timeout "$secs" "$@" 2>&1 | grep -v -e '^step ' -e '^train ' | tee "$OUT/$name.log" | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "=== $name rc=$rc in $((SECONDS - t0)) s" | tee -a "$LOG"
}
if [ "${1:-}" = "--race-only" ]; then
  part race 500 python3 $B/nanogpt_race.py --data $DATA --source pyenv --max-mb 200 \
    --tokenizer .corpus/tok32k.json --budget 40 --evals 4 --eval-tokens 131072 --out "$OUT/race.json"
  exit 0
fi
# the corpus for fp8 and mod: 60 MB of source, about 15M tokens (mod's longer leg reads 9.7M)
part data 75 python3 $B/nanogpt_race.py --data $DATA --source pyenv --max-mb 60 \
  --tokenizer .corpus/tok32k.json --contenders none
part fp8 160 python3 $B/fp8.py --data $DATA --steps 30 --warmup 8 --batch 4 --seq-len 2048 \
  --eval-tokens 65536 --out "$OUT/fp8.json"
part mod 150 python3 $B/mod_isoflops.py --data $DATA --size 124m --dense-steps 200 \
  --eval-tokens 65536 --out "$OUT/mod.json"
part mfu 80 python3 $B/mfu.py --preset 1b-moe --kernels auto --seq-len 2048 --batch 8 \
  --warmup 3 --steps 8 --ceiling --profile /tmp/prof
for f in /tmp/prof/*/summary.txt; do
  [ -f "$f" ] && cp "$f" "$OUT/prof_$(basename "$(dirname "$f")").txt"
done
python3 - "$OUT" <<'EOF' | tee -a "$LOG"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def load(name):
    path = out / name
    return json.loads(path.read_text()) if path.is_file() else None
fp8, mod = load("fp8.json"), load("mod.json")
mfu = [json.loads(line) for line in (out / "mfu.log").read_text().splitlines()
       if line.startswith("{")] if (out / "mfu.log").is_file() else None
print(json.dumps({
    "fp8": fp8 and {"tokens_per_s": {r["name"]: r.get("tokens_per_s") for r in fp8["rows"]},
                    "vs_bf16": fp8["comparisons"]},
    "mod": mod and {"summary": mod["summary"], "train_flops_budget": mod["train_flops_budget"],
                    "legs": [{k: r[k] for k in ("name", "steps", "steps_per_s", "val_loss",
                              "train_wall_s", "phases_s")} for r in mod["rows"]]},
    "mfu": mfu,
}, separators=(",", ":")))
EOF
