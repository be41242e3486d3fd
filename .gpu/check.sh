#!/usr/bin/env bash
# The device check of the paper-scale issue, in parts (together more than one slot: a compiled bench takes about
# a minute, an eager one 15 s, on an H100):
#   suite          the whole test suite on CUDA, one pytest per test file side by side (the resume and
#                  batched-seeds tests have CUDA variants);
#   bench          bench.py at the paper's settings for each of TASKS, compiled and eager: steps/s, MFU,
#                  data share;
#   draws          where each task should draw its batches: on the GPU, on the host, or on the host in a
#                  thread one batch ahead (.gpu/host_data_probe.py, eager);
#   profile        where a compiled step's time goes, needle's and parentheses' (.gpu/step_profile.py),
#                  then the same in CUDA graphs (torch.compile's reduce-overhead mode);
#   deterministic  what --deterministic costs, on needle and parentheses;
#   seeds          ten batched seeds of needle random 1024 against one seed, 500 steps each (time, and
#                  final metrics).
# PARTS picks the parts (default: all six, in that order) and TASKS the benches' tasks (default: all
# seven). UNTIL, in seconds since the epoch, is the slot's end: a bench that could not end before it is
# skipped, so a slot shared with a training run ends on time.
# Run from the repository root on the GPU machine; everything it prints lands in $OUT (the device tool
# brings $OUT back), the suite's whole output in $OUT/pytest.log.
set -uo pipefail
if ! python -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  echo "check.sh: no CUDA GPU here; it measures a lent GPU" >&2
  exit 2
fi
out=${OUT:-/tmp/gpu-check}
parts=${PARTS:-suite bench draws profile deterministic seeds}
tasks=${TASKS:-needle parens addition modadd imitate memorize lm}
until=${UNTIL:-$(($(date +%s) + 3600))}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
log() { echo "== $(date +%T): $*" | tee -a "$out/check.log"; }
time_left() { echo $((until - $(date +%s))); }

bench() {  # bench TASK FLAGS...: one row of the bench table, if a compiled bench still fits the slot
  if [ "$(time_left)" -lt 100 ]; then
    log "bench $* skipped: the slot ends in $(time_left) s"
    return
  fi
  log "bench $*"
  # 20 warm-up steps: compiled parentheses (four chunk lengths a step) timed 6.04 steps/s after the
  # default 3 on the H200, 14.9 after 20 on the H100
  timeout 90 python bench.py --frozen --scale paper --device cuda --warmup-steps 20 --task "$@" 2>&1 | tail -2 \
    | tee -a "$out/check.log"
}

for part in $parts; do
  case $part in
    suite)
      # One pytest per test file, side by side: run whole, one after another, the suite took over
      # 459 s on the H100's 16 cores. Run it with no training beside it: the redraw test reads
      # the committed records, which a run in progress changes. -v names each test as it ends, so
      # a failure is known even if the time runs out; -rf repeats the failures' messages.
      log "pytest, one process per test file"
      pids=""
      for file in tests/test_*.py; do
        name=$(basename "$file" .py)
        timeout "${SUITE_SECONDS:-300}" python -m pytest -v -rf -p no:logging -p no:cacheprovider \
          --basetemp="/tmp/pytest-$name" "$file" >"$out/pytest-$name.log" 2>&1 &
        pids="$pids $!"
      done
      for pid in $pids; do wait "$pid"; done
      for file in "$out"/pytest-*.log; do
        log "$(basename "$file" .log): $(tail -1 "$file")"
      done
      ;;
    bench)
      for task in $tasks; do
        bench "$task" --compile
        bench "$task" --no-compile
      done
      ;;
    draws)
      log "where each task draws its batches (eager): device, host, host a thread ahead"
      timeout 240 python .gpu/host_data_probe.py --device cuda parens needle addition modadd 2>&1 \
        | tee -a "$out/check.log"
      ;;
    profile)
      log "where a compiled step's time goes"
      timeout 240 python .gpu/step_profile.py --device cuda needle parens 2>&1 | grep -v "^USDT" \
        | tee -a "$out/check.log"
      log "the same step in CUDA graphs (launch overhead's remedy)"
      timeout 240 python .gpu/step_profile.py --device cuda --mode reduce-overhead needle parens 2>&1 \
        | grep -v "^USDT" | tee -a "$out/check.log"
      ;;
    deterministic)
      bench needle --deterministic
      bench parens --deterministic
      ;;
    seeds)
      log "one seed against ten batched, needle random 1024, 500 steps"
      common="--task needle --frozen --scale paper --steps 500 --eval-every 500 --device cuda"
      /usr/bin/time -f "one seed: %e s" python train.py $common --out /tmp/one 2>&1 | tail -2 \
        | tee -a "$out/check.log"
      /usr/bin/time -f "ten seeds batched: %e s" python batched_seeds.py $common --seeds 10 --out /tmp/ten \
        2>&1 | tail -2 | tee -a "$out/check.log"
      python - <<'PY' 2>&1 | tee -a "$out/check.log"
import json
one = json.load(open("/tmp/one/final.json"))
ten = json.load(open("/tmp/ten-s0/final.json"))
print("seed 0 alone:", one["accuracy"], one["loss"], "| batched:", ten["accuracy"], ten["loss"])
PY
      ;;
    *)
      echo "check.sh: unknown part '$part' (suite, bench, deterministic, seeds)" >&2
      exit 2
      ;;
  esac
done
log "end of $parts"
