#!/usr/bin/env bash
# How long a supervised job takes to get back to work after a rank is
# killed: `moetron launch -n RANKS --max-restarts 1` trains configs/demo.toml
# with a checkpoint after every step; MOETRON_INJECT_FAILURE kills rank 2 at
# the start of step 4. A watcher records every heartbeat change (mtime and
# content) at 10 ms. Per round it prints, in seconds: the kill (the
# injected-0 marker's mtime) to the supervisor's detection (mpirun exited),
# detection to the relaunched ranks' step-0 heartbeats (MPI is up), those to
# the first step's start (trainer start-up, of which the checkpoint load as
# the "resume" event says), that step's length, and the total: kill to the
# first step completed after the restart.
#
# --state snapshot resumes from in-memory snapshots instead (one after every
# step, no disk checkpoint before the end); the report then names the
# resumed step, and steps lost = the failed step - 1 - that step.
#
#   bench/restart_time.sh --data DIR [--ranks 4] [--rounds 3] [--state checkpoint|snapshot]
#     [--moetron build/moetron]
set -euo pipefail
data="" ranks=4 rounds=3 moetron="" state=checkpoint
while [[ $# -gt 0 ]]; do
  case "$1" in
    --data) data=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --moetron) moetron=$2; shift 2 ;;
    --state) state=$2; shift 2 ;;
    *) echo "restart_time.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -n "$data" ]] || { echo "restart_time.sh: --data DIR (a prepared corpus) is required" >&2; exit 2; }
case "$state" in
  checkpoint) state_sets=(--set checkpoint.every=1 --set checkpoint.snapshot_every=0) ;;
  snapshot) state_sets=(--set checkpoint.every=0 --set checkpoint.snapshot_every=1) ;;
  *) echo "restart_time.sh: --state is checkpoint or snapshot, got '$state'" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
moetron=${moetron:-$root/build/moetron}
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
work=$(mktemp -d)
# Snapshots on tmpfs, as in production (a directory of its own, removed at the end).
shm=$(mktemp -d /dev/shm/moetron-restart-bench.XXXXXX)
trap 'rm -rf "$work" "$shm"' EXIT

cat > "$work/watch.py" <<'PY'
import glob, os, sys, time
logs, until = sys.argv[1], time.time() + float(sys.argv[2])
seen = {}
while time.time() < until and not os.path.exists(logs + "/../done"):
    for p in glob.glob(logs + "/rank-*.heartbeat"):
        try:
            text, mtime = open(p).read().split(), os.stat(p).st_mtime
        except (OSError, ValueError):
            continue
        key = (text[0], text[2]) if len(text) > 2 else tuple(text)
        if seen.get(p) != key:
            seen[p] = key
            print("%.3f %s %s" % (mtime, os.path.basename(p), " ".join(key)), flush=True)
    time.sleep(0.01)
PY

cat > "$work/report.py" <<'PY'
import json, os, sys
run, beats_file = sys.argv[1], sys.argv[2]
events = [json.loads(l) for l in open(run + "/events.jsonl")]
first = lambda kind: next(e for e in events if e["kind"] == kind)
failure, recovered, resume = first("failure"), first("recovered"), first("resume")
killed = os.stat(run + "/logs/injected-0").st_mtime
detected = failure["detected_at"]
done = detected + recovered["seconds"]
beats = [l.split() for l in open(beats_file)]
up = min(float(b[0]) for b in beats if float(b[0]) > detected and b[2:4] == ["0", "start"])
start = min(float(b[0]) for b in beats if float(b[0]) > up and b[3] == "start" and b[2] != "0")
lost = failure["last_step"] - 1 - resume["step"]  # completed steps done again
print("kill->detected %.2f | ->MPI up %.2f | ->first step starts %.2f (%s load %.2f) | "
      "first step %.2f | kill->first completed step %.2f | resumed step %d, steps lost %d"
      % (detected - killed, up - detected, start - up, resume.get("source", "checkpoint"),
         resume["seconds"], done - start, done - killed, resume["step"], lost))
PY

for ((r = 1; r <= rounds; ++r)); do
  run="$work/run$r"
  mkdir -p "$run/logs"
  python3 "$work/watch.py" "$run/logs" 600 > "$work/beats$r" &
  watcher=$!
  MOETRON_INJECT_FAILURE="rank=2,step=4,kind=kill" "$moetron" launch -n "$ranks" --max-restarts 1 \
    -- train --config "$root/configs/demo.toml" --out "$run" --set data.path="$data" \
    "${state_sets[@]}" --set checkpoint.snapshot_dir="$shm" --set train.steps=6 \
    > "$work/out$r" 2>&1 ||
    { echo "round $r: launch failed:" >&2; tail -20 "$work/out$r" >&2; exit 1; }
  touch "$run/done"
  wait "$watcher"
  echo "round $r: $(python3 "$work/report.py" "$run" "$work/beats$r")"
done
