#!/usr/bin/env bash
# The reinforcement-learning layout search against the exhaustive one:
# `moetron plan --search both` for each preset x cluster x seed, one JSON
# line each (the gap of the policy alone and after its local polish, the
# evaluations of both searches, their times), then a summary table.
#
#   bench/rl_search.sh [--seeds 5] [--device h200] [--out FILE.jsonl] [--moetron build/moetron]
set -euo pipefail
seeds=5 device=h200 out="" moetron=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seeds) seeds=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --moetron) moetron=$2; shift 2 ;;
    *) echo "rl_search.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
root=$(cd "$(dirname "$0")/.." && pwd)
moetron=${moetron:-$root/build/moetron}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
lines=$work/lines.jsonl
for model in mixtral-8x7b mixtral-8x22b moe-1.6t; do
  for cluster in 8x8 64x8 128x8; do
    for seed in $(seq 1 "$seeds"); do
      if ! (cd "$root" && "$moetron" plan --model "$model" --cluster "$cluster" --device "$device" \
              --top 1 --search both --seed "$seed" --json "$work/p.json" >/dev/null 2>"$work/err"); then
        echo "{\"model\": \"$model\", \"cluster\": \"$cluster\", \"seed\": $seed, \"error\": \"$(head -c 200 "$work/err" | tr '"\n' "' ")\"}" >>"$lines"
        continue
      fi
      python3 - "$work/p.json" "$model" "$cluster" "$seed" >>"$lines" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
rl, ex = j["rl"], j["exhaustive"]
print(json.dumps({"model": sys.argv[2], "cluster": sys.argv[3], "seed": int(sys.argv[4]),
                  "gap": rl["gap_to_exhaustive"], "policy_gap": rl["policy_gap_to_exhaustive"],
                  "rl_evaluations": rl["evaluations"], "policy_evaluations": rl["policy_evaluations"],
                  "exhaustive_evaluations": ex["evaluated"], "rl_s": rl["seconds"],
                  "exhaustive_s": ex["seconds"], "best": j["plans"][0]["layout"]}))
PY
    done
  done
done
[[ -z "$out" ]] || cp "$lines" "$out"
python3 - "$lines" <<'PY'
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'model':14} {'cluster':8} {'policy gap mean/max':>20} {'polished max':>13} {'rl evals':>9} {'exhaustive':>10} {'rl s':>6} {'exh s':>6}")
keys = []
for r in rows:
    k = (r["model"], r["cluster"])
    if k not in keys: keys.append(k)
for k in keys:
    g = [r for r in rows if (r["model"], r["cluster"]) == k]
    if any("error" in r for r in g):
        print(f"{k[0]:14} {k[1]:8} {g[0].get('error', '')[:80]}")
        continue
    pg = [100 * r["policy_gap"] for r in g]
    print(f"{k[0]:14} {k[1]:8} {st.mean(pg):9.2f}% {max(pg):8.2f}% {100 * max(r['gap'] for r in g):12.2f}% "
          f"{st.mean(r['rl_evaluations'] for r in g):9.0f} {g[0]['exhaustive_evaluations']:10d} "
          f"{st.mean(r['rl_s'] for r in g):6.3f} {g[0]['exhaustive_s']:6.3f}")
PY
