#!/usr/bin/env bash
# The long-sequence issue's retrieval probe: the same small model
# (bench/retrieval-8k.toml) trained for the same steps on 8K-token
# key-retrieval examples, once with both layers local (window 256:
# attention.layer_pattern = "LL") and once with the second layer global
# ("LG"); then `moetron eval --task retrieval` on the held-out examples.
# Window-only cannot see the key from the query, so it should stay near
# chance (1 / key vocabulary); the hybrid's global layer can carry it.
#
#   bench/retrieval_window_vs_hybrid.sh [--steps 400] [--key-len 16] [--key-within 64]
#     [--patterns "LL LG"] [--threads 2] [--json FILE]
set -euo pipefail
steps=400 key_len=16 key_within=64 patterns="LL LG" threads=2 json="" moetron=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --key-len) key_len=$2; shift 2 ;;
    --key-within) key_within=$2; shift 2 ;;
    --patterns) patterns=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --moetron) moetron=$2; shift 2 ;;
    *) echo "retrieval_window_vs_hybrid.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
root=$(cd "$(dirname "$0")/.." && pwd)
moetron=${moetron:-$root/build/moetron}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$moetron" prepare-data --task retrieval --seq-len 8192 --examples 1024 --key-len "$key_len" \
  --key-within "$key_within" --out "$work/data" >/dev/null
printf '%-8s %6s %10s %10s %9s %8s\n' pattern steps final_loss accuracy chance s/step
[[ -n "$json" ]] && : > "$json"
for pattern in $patterns; do
  run="$work/run-$pattern"
  "$moetron" train --config "$root/bench/retrieval-8k.toml" --out "$run" \
    --set "data.path=$work/data" --set "train.steps=$steps" --set "train.threads=$threads" \
    --set "checkpoint.every=$steps" --set "attention.layer_pattern=$pattern" >"$work/train-$pattern.log"
  score=$("$moetron" eval --task retrieval --checkpoint "$run" --data "$work/data")
  python3 - "$pattern" "$steps" "$run/metrics.jsonl" "$score" "$json" <<'PY'
import json, sys
pattern, steps, metrics, score, out = sys.argv[1:6]
lines = [json.loads(l) for l in open(metrics) if '"loss"' in l and '"step"' in l]
s = json.loads(score)
step_s = sorted(l.get("step_s", 0) for l in lines[1:])
med = step_s[len(step_s) // 2] if step_s else 0
print(f"{pattern:<8} {steps:>6} {lines[-1]['loss']:>10.4f} {s['accuracy']:>10.4f} {s['chance']:>9.4f} {med:>8.2f}")
if out:
    with open(out, "a") as f:
        f.write(json.dumps({"pattern": pattern, "steps": int(steps), "final_loss": lines[-1]["loss"],
                            "median_step_s": med, **s}) + "\n")
PY
done
