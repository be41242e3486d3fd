#!/usr/bin/env bash
# One short GPU slot of the paper-scale issue, everything at once within SLOT_SECONDS (default 540):
#   - the CUDA suite (check.sh's suite part), pinned to cores 0-11, in the background;
#   - meanwhile check.sh's benches, pinned to cores 12-15: each task compiled, then eager, skipped
#     once the slot's end is near (the suite shares the GPU with them: a few of its tests use it);
#   - once the suite is done, with the time left: where each task draws its batches fastest and
#     where a compiled step's time goes (check.sh's draws and profile), a 1,000-step canonical
#     needle run (its first line's estimate against the time it took), then ten batched seeds
#     against one (check.sh's seeds).
# Run from the repository root on the GPU machine; everything lands in $OUT.
set -uo pipefail
out=${OUT:-/tmp/slot}
mkdir -p "$out"
export OUT=$out
export UNTIL=$(($(date +%s) + ${SLOT_SECONDS:-540}))
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$out/device.txt" 2>&1
python -c "import torch; print(torch.__version__, torch.version.cuda)" >>"$out/device.txt" 2>&1
git log -1 --format=%h >>"$out/device.txt" 2>/dev/null

pin() {  # pin CORES COMMAND...: on those cores where taskset is there
  if command -v taskset >/dev/null; then taskset -c "$@"; else shift; "$@"; fi
}
PARTS=suite pin 0-11 bash .gpu/check.sh >"$out/suite.out" 2>&1 &
suite=$!
PARTS=bench pin 12-15 bash .gpu/check.sh >"$out/bench.out" 2>&1
wait "$suite"
if [ $((UNTIL - $(date +%s))) -gt 300 ]; then
  PARTS="draws profile" bash .gpu/check.sh >"$out/draws.out" 2>&1
fi
left=$((UNTIL - $(date +%s) - 15))
if [ "$left" -gt 90 ]; then
  echo "== canonical needle, 1,000 steps, at most $left s" >>"$out/check.log"
  began=$SECONDS
  timeout "$left" python train.py --task needle --frozen --steps 1000 --out /tmp/canonical \
    >"$out/canonical.out" 2>&1
  echo "canonical run: $((SECONDS - began)) s in all" >>"$out/check.log"
  cp /tmp/canonical/config.json /tmp/canonical/final.json /tmp/canonical/metrics.jsonl "$out/" \
    2>/dev/null
  grep -v "it/s" "$out/canonical.out" | head -4 >>"$out/check.log"
fi
if [ $((UNTIL - $(date +%s))) -gt 120 ]; then
  PARTS=seeds bash .gpu/check.sh >"$out/seeds.out" 2>&1
fi
echo "== slot end" >>"$out/check.log"
