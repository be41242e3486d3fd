#!/usr/bin/env bash
# One GPU slot of the paper's protocol: train the next unfinished runs of RUNS in order, stop the one in progress
# with a checkpoint before the slot ends, and pack every record for the trip back. A later slot carries the
# records (checkpoints included: a checkpoint holds the weights that train, not the frozen blocks, which the
# seed rebuilds) and goes on where this one stopped. Run from the repository root, on the device:
#     bash .gpu/paper-scale.sh        # with runs/reproduce/table1-paper carried there
# then here: tar -xf <files_at>/records.tar, and commit the records (git ignores checkpoints and weights).
set -uo pipefail
out=${OUT:-/tmp/slot}
# The slot's 9 minutes (the machine's start and the transfers take the rest), or up to UNTIL (seconds since
# the epoch) when the slot is shared with .gpu/check.sh
slot=${SLOT_SECONDS:-540}
if [ -n "${UNTIL:-}" ]; then
  slot=$((UNTIL - $(date +%s)))
fi
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export TORCH_LOGS=${TORCH_LOGS:-recompiles}  # why torch.compile recompiled, if it did, in slot.log
table=runs/reproduce/table1-paper
# First the decisive run (the cpu scale's parentheses random cell reached 95.1%, the paper's 100), then the
# random-1024 column of Table 1 at 3 seeds.
# RUNS, if set, names the runs instead.
if [ -z "${RUNS:-}" ]; then
  RUNS="parens-random-1024-s0"
  for seed in 0 1 2; do
    for task in needle addition parens modadd; do RUNS="$RUNS $task-random-1024-s$seed"; done
  done
fi

commands="$out/commands.txt"  # the table's commands: this script writes only under $OUT and the records
python reproduce.py table1 --scale paper --print-commands 2>/dev/null > "$commands"
for run in $RUNS; do
  dir=$table/$run
  [ -e "$dir/final.json" ] && continue
  left=$((slot - SECONDS - 45))  # time to stop at a step boundary, save and pack
  [ "$left" -gt 90 ] || break
  if [ -e "$dir/config.json" ]; then
    command="python train.py --resume $dir"
  else
    command=$(grep -F " --out $dir " "$commands" | sed -n 's/.*; else \(python train.py .*\); fi$/\1/p')
  fi
  echo "== $SECONDS s: $command (at most $left s)" | tee -a "$out/slot.log"
  # SIGTERM stops train.py at the end of a step, with a checkpoint to resume from
  timeout --signal=TERM --kill-after=30 "$left" $command 2>&1 | tee -a "$out/slot.log"
  if [ -e "$dir/final.json" ] && [[ $run == parens-* ]]; then  # accuracy on the strings training never shows
    python analyze.py "$dir" --only lengths 2>&1 | tail -3 | tee -a "$out/slot.log"
  fi
done
rm -f "$commands"
tar -cf "$out/records.tar" --exclude=model.pt "$table" 2>&1 | tee -a "$out/slot.log"
echo "== $SECONDS s: end" | tee -a "$out/slot.log"
