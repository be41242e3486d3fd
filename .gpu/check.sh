#!/usr/bin/env bash
# The device check of the paper-scale issue, one GPU slot (about 9 minutes on an H100 or H200):
#   1. the whole test suite on CUDA (the resume and batched-seeds tests have CUDA variants);
#   2. bench.py at the paper's settings for every task, compiled and eager: steps/s, MFU, data share;
#   3. what --deterministic costs, on needle and parentheses;
#   4. ten batched seeds of needle random 1024 against one seed, 500 steps each (time, and final metrics).
# Run from the repository root; everything it prints lands in $OUT (the device tool brings $OUT back).
set -uo pipefail
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
log() { echo "== $((SECONDS)) s: $*" | tee -a "$out/check.log"; }

log "environment"
{ nvidia-smi --query-gpu=name,memory.total --format=csv; python -c "import torch; print(torch.__version__)"; git log -1 --oneline; } \
  2>&1 | tee -a "$out/check.log"

log "pytest"
timeout 240 python -m pytest -q -x -p no:logging -p no:cacheprovider 2>&1 | tail -15 | tee -a "$out/check.log"

for task in needle parens addition modadd imitate memorize lm; do
  for compile in --compile --no-compile; do
    log "bench $task $compile"
    timeout 90 python bench.py --task "$task" --frozen --scale paper --device cuda $compile 2>&1 | tail -2 | tee -a "$out/check.log"
  done
done
for task in needle parens; do
  log "bench $task --deterministic"
  timeout 90 python bench.py --task "$task" --frozen --scale paper --device cuda --deterministic 2>&1 | tail -2 | tee -a "$out/check.log"
done

log "one seed against ten batched, needle random 1024, 500 steps"
common="--task needle --frozen --scale paper --steps 500 --eval-every 500 --device cuda"
/usr/bin/time -f "one seed: %e s" python train.py $common --out /tmp/one 2>&1 | tail -2 | tee -a "$out/check.log"
/usr/bin/time -f "ten seeds batched: %e s" python batched_seeds.py $common --seeds 10 --out /tmp/ten 2>&1 | tail -2 \
  | tee -a "$out/check.log"
python - <<'PY' 2>&1 | tee -a "$out/check.log"
import json
one = json.load(open("/tmp/one/final.json"))
ten = json.load(open("/tmp/ten-s0/final.json"))
print("seed 0 alone:", one["accuracy"], one["loss"], "| batched:", ten["accuracy"], ten["loss"])
PY
log "end"
