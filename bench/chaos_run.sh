#!/usr/bin/env bash
# The high-availability issue's chaos run: `moetron launch -n RANKS` trains
# configs/demo.toml for STEPS steps twice, once clean and once with a
# failure of a random kind (kill, exit, error, segv, hang) on a random rank
# about every EVERY steps (seeded), and the supervisor left to recover by
# itself. Prints, and writes as one JSON line: the failures injected, the
# restarts the supervisor made, both wall times, the chaos run's effective
# training time (the step times of the steps that count, i.e. the last run
# of each step, over the wall time), and whether its final weights equal
# the clean run's byte for byte.
#
#   bench/chaos_run.sh --data DIR [--steps 500] [--every 50] [--ranks 4] [--seed 1]
#     [--checkpoint-every 10] [--heartbeat-timeout 10] [--json FILE] [--moetron build/moetron]
set -euo pipefail
data="" steps=500 every=50 ranks=4 seed=1 ckpt_every=10 hb=10 json="" moetron=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --data) data=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --every) every=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --checkpoint-every) ckpt_every=$2; shift 2 ;;
    --heartbeat-timeout) hb=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --moetron) moetron=$2; shift 2 ;;
    *) echo "chaos_run.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -n "$data" ]] || { echo "chaos_run.sh: --data DIR (a prepared corpus) is required" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
moetron=${moetron:-$root/build/moetron}
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One failure in each window of EVERY steps after the first, at a random
# step of its window, on a random rank, of a random kind.
failures=$(python3 - "$steps" "$every" "$ranks" "$seed" <<'PY'
import random, sys
steps, every, ranks, seed = map(int, sys.argv[1:5])
rng = random.Random(seed)
kinds = ["kill", "exit", "error", "segv", "hang"]
out = []
for lo in range(every, steps, every):
    step = rng.randrange(lo, min(lo + every, steps))
    out.append(f"rank={rng.randrange(ranks)},step={step},kind={rng.choice(kinds)}")
print(";".join(out))
PY
)
n_failures=$(tr ';' '\n' <<<"$failures" | grep -c .)

train_args=(train --config "$root/configs/demo.toml" --set data.path="$data" --set train.steps="$steps"
  --set checkpoint.every="$ckpt_every" --set checkpoint.keep=2 --set checkpoint.snapshot_every=0
  --set train.eval_every=0)

run() {  # run NAME [env...]: prints the wall seconds
  local name=$1
  shift
  local t0 t1
  t0=$(date +%s.%N)
  env "$@" "$moetron" launch -n "$ranks" --threads-per-rank 1 --max-restarts $((n_failures + 2)) \
    --heartbeat-timeout "$hb" -- "${train_args[@]}" --out "$work/$name" >"$work/$name.out" 2>&1 ||
    { echo "chaos_run.sh: the $name run failed:" >&2; tail -30 "$work/$name.out" >&2; exit 1; }
  t1=$(date +%s.%N)
  python3 -c "print(f'{$t1 - $t0:.1f}')"
}

echo "failures ($n_failures): $failures"
clean_s=$(run clean)
echo "clean run: $clean_s s"
chaos_s=$(run chaos MOETRON_INJECT_FAILURE="$failures")
echo "chaos run: $chaos_s s"

python3 - "$work" "$steps" "$clean_s" "$chaos_s" "$failures" "$json" <<'PY'
import json, sys
work, steps, clean_s, chaos_s, failures, out = sys.argv[1:7]
steps, clean_s, chaos_s = int(steps), float(clean_s), float(chaos_s)
def step_times(run):
    last = {}
    for line in open(f"{work}/{run}/metrics.jsonl"):
        d = json.loads(line)
        if "step" in d and "step_s" in d and "loss" in d:
            last[d["step"]] = d["step_s"]  # a replayed step: its last run counts
    return last
clean, chaos = step_times("clean"), step_times("chaos")
assert len(chaos) == steps, f"the chaos run has {len(chaos)} of {steps} steps"
events = [json.loads(l) for l in open(f"{work}/chaos/events.jsonl")]
kinds = lambda k: [e for e in events if e["kind"] == k]
recovered = [e["seconds"] for e in kinds("recovered")]
ckpt = lambda run: open(f"{work}/{run}/checkpoints/step-{steps}/model.safetensors", "rb").read()
same = ckpt("clean") == ckpt("chaos")
res = {
    "steps": steps, "failures_injected": len(failures.split(";")),
    "failures_seen": len(kinds("failure")), "restarts": len(kinds("restart")),
    "causes": sorted({e.get("cause", "?") for e in kinds("failure")}),
    "clean_wall_s": clean_s, "chaos_wall_s": chaos_s,
    "clean_effective": sum(clean.values()) / clean_s,
    "chaos_effective": sum(chaos.values()) / chaos_s,
    "chaos_over_clean_wall": chaos_s / clean_s,
    "recovery_s_median": sorted(recovered)[len(recovered) // 2] if recovered else None,
    "final_weights_identical": same,
}
print(json.dumps(res, indent=1))
if out:
    with open(out, "a") as f:
        f.write(json.dumps(res) + "\n")
PY
