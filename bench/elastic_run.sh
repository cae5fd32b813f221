#!/usr/bin/env bash
# The high-availability issue's elastic run: `moetron launch -n 4
# --min-ranks 3` trains configs/demo.toml for STEPS steps while a node is
# lost and comes back. At step SHRINK rank 3 is killed and named
# unavailable (RUN/logs/unavailable), so the supervisor relaunches on 3
# ranks; when the run passes step GROW, RUN/logs/capacity says 4 again and
# the job stops at the end of a step and grows back. The global batch is
# kept by accumulation (micro-batch 4, 48 sequences a step: 3 micro-batches
# a rank at dp 4, 4 at dp 3). Prints, and writes as one JSON line: the
# resizes, the steps run again (the work lost: steps computed more than
# once, over STEPS), and the wall time against a run of the same steps that
# nothing interrupts.
#
#   bench/elastic_run.sh --data DIR [--steps 500] [--shrink 150] [--grow 350]
#     [--checkpoint-every 5] [--json FILE] [--moetron build/moetron]
set -euo pipefail
data="" steps=500 shrink=150 grow=350 ckpt_every=5 json="" moetron=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --data) data=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --shrink) shrink=$2; shift 2 ;;
    --grow) grow=$2; shift 2 ;;
    --checkpoint-every) ckpt_every=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --moetron) moetron=$2; shift 2 ;;
    *) echo "elastic_run.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -n "$data" ]] || { echo "elastic_run.sh: --data DIR (a prepared corpus) is required" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
moetron=${moetron:-$root/build/moetron}
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

train_args=(train --config "$root/configs/demo.toml" --set data.path="$data" --set train.steps="$steps"
  --set train.micro_batch=4 --set train.global_batch=48 --set checkpoint.every="$ckpt_every"
  --set checkpoint.keep=2 --set checkpoint.snapshot_every=0 --set train.eval_every=0)

launch() {  # launch NAME [env...]
  local name=$1
  shift
  env "$@" "$moetron" launch -n 4 --threads-per-rank 1 --min-ranks 3 --max-restarts 2 \
    -- "${train_args[@]}" --out "$work/$name" >"$work/$name.out" 2>&1 ||
    { echo "elastic_run.sh: the $name run failed:" >&2; tail -30 "$work/$name.out" >&2; exit 1; }
}

last_step() {  # the newest step in RUN/metrics.jsonl (0 before the first)
  local s
  s=$(tail -n 1 "$1/metrics.jsonl" 2>/dev/null | grep -o '"step":[0-9]*' | cut -d: -f2) || true
  echo "${s:-0}"
}

t0=$(date +%s.%N)
launch steady
t1=$(date +%s.%N)
echo "uninterrupted run: $(python3 -c "print(f'{$t1 - $t0:.1f}')") s"

run="$work/elastic"
mkdir -p "$run/logs"
(  # the node's story: lost at the kill, back at step GROW
  while [[ ! -e "$run/logs/injected-0" ]]; do sleep 0.05; done
  echo 3 > "$run/logs/unavailable"
  while (($(last_step "$run") < grow)); do sleep 0.2; done
  echo 4 > "$run/logs/capacity"
) &
story=$!
t2=$(date +%s.%N)
launch elastic MOETRON_INJECT_FAILURE="rank=3,step=$shrink,kind=kill"
t3=$(date +%s.%N)
wait "$story" || true

python3 - "$work" "$steps" "$(python3 -c "print($t1 - $t0)")" "$(python3 -c "print($t3 - $t2)")" \
  "$json" <<'PY'
import json, sys
work, steps, steady_s, elastic_s, out = sys.argv[1:6]
steps, steady_s, elastic_s = int(steps), float(steady_s), float(elastic_s)
runs = {}
for line in open(f"{work}/elastic/metrics.jsonl"):
    d = json.loads(line)
    if "step" in d and "loss" in d:
        runs[d["step"]] = runs.get(d["step"], 0) + 1
events = [json.loads(l) for l in open(f"{work}/elastic/events.jsonl")]
resizes = [{"from": e.get("from"), "to": e.get("to"), "step": e.get("step")}
           for e in events if e["kind"] == "resize"]
again = sum(n - 1 for n in runs.values())
res = {"steps": steps, "steps_done": len(runs), "resizes": resizes,
       "failures": sum(e["kind"] == "failure" for e in events),
       "restarts_on_ranks": [e.get("ranks") for e in events if e["kind"] == "restart"],
       "steps_run_again": again, "progress_lost": again / steps,
       "uninterrupted_wall_s": round(steady_s, 1), "elastic_wall_s": round(elastic_s, 1)}
print(json.dumps(res, indent=1))
assert len(runs) == steps, "the elastic run did not finish every step"
if out:
    with open(out, "a") as f:
        f.write(json.dumps(res) + "\n")
PY
