#!/usr/bin/env bash
# Pipeline stage balance, FLOPs against measured costs: trains bench-moe at
# pp 2 on 2 ranks with each parallel.stage_balance, then prints per run the
# split, the median step time, rank 0's pipeline wait share and each stage's
# busy time (steps 2..N; metrics.jsonl), as a table and as JSON lines.
#
#   bench/pipeline_stage_balance.sh --data DIR [--layers 8] [--vocab 32768]
#       [--seq 256] [--microbatches 8] [--steps 6] [--json FILE]
set -euo pipefail
data="" layers=8 vocab=32768 seq=256 m=8 steps=6 json=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --data) data=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --vocab) vocab=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --microbatches) m=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    *) echo "pipeline_stage_balance.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -n "$data" ]] || { echo "pipeline_stage_balance.sh: --data DIR (a prepared corpus) is required" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
export OMP_NUM_THREADS=1
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
lines=()
for balance in flops measured; do
  out="$work/$balance"
  mpirun -np 2 --bind-to none "$root/build/moetron" train --config "$root/configs/bench-moe.toml" --out "$out" \
    --set data.path="$data" --set model.vocab_size="$vocab" --set model.n_layers="$layers" \
    --set train.seq_len="$seq" --set model.max_seq_len="$seq" --set train.micro_batch=1 \
    --set train.global_batch="$m" --set parallel.pp=2 --set train.steps="$steps" --set train.eval_batches=1 \
    --set parallel.stage_balance="$balance" --set train.threads=1 > "$work/$balance.log" 2>&1 ||
    { cat "$work/$balance.log" >&2; exit 1; }
  split=$(grep -m1 "^pipeline:" "$work/$balance.log" | sed 's/^pipeline: 2 stages of layers //')
  lines+=("$(python3 - "$out/metrics.jsonl" "$balance" "$split" "$layers" "$vocab" "$seq" "$m" <<'PY'
import json, statistics, sys
path, balance, split, layers, vocab, seq, m = sys.argv[1:]
rows = [json.loads(l) for l in open(path)]
r = [x for x in rows if x["step"] >= 2] or rows
med = statistics.median
busy = [med(x["stage_busy_s"][i] for x in r) for i in range(len(r[0]["stage_busy_s"]))]
print(json.dumps({"bench": "pipeline_stage_balance", "balance": balance, "split": split, "layers": int(layers),
                  "vocab": int(vocab), "seq_len": int(seq), "microbatches": int(m),
                  "step_s": med(x["step_s"] for x in r),
                  "rank0_wait_share": med(x["pipeline_wait_s"] / x["step_s"] for x in r),
                  "stage_busy_s": busy, "busy_max_over_min": max(busy) / min(busy)}))
PY
)")
done
printf '%-9s | %-60s | %7s | %11s | %-16s | %s\n' balance split "step s" "rank0 wait" "stage busy s" "max/min"
for l in "${lines[@]}"; do
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print("%-9s | %-60s | %7.2f | %11.3f | %-16s | %.2f" % (d["balance"], d["split"][:60], d["step_s"], d["rank0_wait_share"], " / ".join("%.2f" % b for b in d["stage_busy_s"]), d["busy_max_over_min"]))' "$l"
done
for l in "${lines[@]}"; do echo "$l"; [[ -z "$json" ]] || echo "$l" >> "$json"; done
