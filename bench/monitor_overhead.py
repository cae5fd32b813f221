#!/usr/bin/env python3
"""What monitoring costs in step time, end to end (issue 20).

Trains bench-moe at dp 2 on 2 ranks in interleaved rounds, one run per mode
and round, the mode order rotated each round so that a slow stretch of the
machine is not always charged to the same mode:

  off   monitor.enabled = false
  on    the registry, the rank gather and metrics.jsonl's series, no
        per-layer statistics (monitor.layer_stats_every = 0)
  all   on + per-layer statistics and update norms every step + the HTTP
        server (monitor.serve, nobody scraping)

A step's time is its whole period: the interval between the progress lines
of consecutive steps, which rank 0 prints after the step's metrics line is
written (so it covers the metrics, the series and the line too; step_s in
metrics.jsonl stops before them). Steps 1..warmup are left out, and so is
the last step, whose period holds the run's validation. Per mode: the median
period. Per mode against off: each round's ratio of median periods (the
runs of a round are minutes apart, so a busy stretch of the shared machine
mostly hits a round's runs alike), their median as the overhead, and a
bootstrap 95% interval of that median over the rounds. A round whose "off"
run and the mode's run met different load shows as an outlier ratio; the
median of rounds ignores a few, the pooled-median ratio (also printed) does
not.

With --compare-binary B, "all" also runs with binary B (another build, e.g.
the commit before a change) as mode "all@B", in the same rounds.

  bench/monitor_overhead.py --data DIR [--rounds 8] [--steps 10] [--json FILE]

DIR: `moetron prepare-data --input /usr/share/games/fortunes --vocab-size 8192
--out DIR`. Series count: --series-ranks 4 adds a 4-rank run and counts the
distinct series of its last metrics.jsonl line.
"""
import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = {
    "off": ["monitor.enabled=false"],
    "on": ["monitor.layer_stats_every=0"],
    "all": ["monitor.layer_stats_every=1", "monitor.update_stats=true",
            "monitor.serve=true", "monitor.port=0"],
}
STEP = re.compile(rb"step\s+(\d+)/(\d+)")


def train_command(args, binary, out, sets, np=2):
    cmd = ["mpirun", "-np", str(np), "--bind-to", "none"]
    if np > os.cpu_count():
        cmd.append("--oversubscribe")
    cmd += [binary, "train", "--config", os.path.join(ROOT, "configs/bench-moe.toml"),
            "--out", out]
    common = [f"data.path={args.data}", f"model.vocab_size={args.vocab}",
              f"train.steps={args.steps}", "train.eval_batches=1", "train.threads=1",
              "train.log_every=1",
              # An automatic first snapshot would land in one mode's periods.
              "checkpoint.snapshot_every=0"]
    for s in common + sets:
        cmd += ["--set", s]
    return cmd


def timed_run(cmd, log_path):
    """Runs cmd; returns {step: arrival time of its progress line}."""
    seen = {}
    with open(log_path, "wb") as log:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        tail = b""
        while True:
            chunk = os.read(p.stdout.fileno(), 65536)
            if not chunk:
                break
            now = time.monotonic()
            log.write(chunk)
            # Progress lines end in \r on a terminal (rank 0's stdout under
            # mpirun is one) or \n: match on the text since the last match.
            tail += chunk
            last = 0
            for m in STEP.finditer(tail):
                seen.setdefault(int(m.group(1)), now)
                last = m.end()
            tail = tail[last:][-256:]
        if p.wait() != 0:
            sys.stderr.write(open(log_path, errors="replace").read())
            raise SystemExit(f"monitor_overhead: {' '.join(cmd)} failed ({p.returncode})")
    return seen


def periods(seen, warmup, steps):
    missing = [s for s in range(warmup, steps) if s not in seen]
    if missing:
        raise SystemExit(f"monitor_overhead: no progress line for steps {missing}")
    return [seen[s] - seen[s - 1] for s in range(warmup + 1, steps)]


def step_s(run_dir, warmup, steps):
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    return [r["step_s"] for r in rows if warmup < r["step"] < steps]


def bootstrap_median(values, n=4000, seed=1):
    """95% interval of the median of `values` drawn with replacement."""
    rng = random.Random(seed)
    k = len(values)
    meds = sorted(statistics.median(rng.choices(values, k=k)) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def count_series(args, work):
    out = os.path.join(work, "series")
    cmd = train_command(args, args.binary, out,
                        ["train.steps=3", "train.micro_batch=2", "monitor.layer_stats_every=1",
                         "monitor.update_stats=true"], np=args.series_ranks)
    timed_run(cmd, os.path.join(work, "series.log"))
    last = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))][-1]
    return len(last["series"])


def summarise(args, per):
    """per[mode] = list over rounds of (periods, step_s)."""
    pooled = {m: [x for r in per[m] for x in r[0]] for m in per}
    res = {"bench": "monitor_overhead", "dp": 2, "rounds": args.rounds, "steps": args.steps,
           "warmup": args.warmup, "modes": {}}
    off_rounds = [r[0] for r in per["off"]]
    off_med = statistics.median(pooled["off"])
    for m in per:
        med = statistics.median(pooled[m])
        row = {"median_period_s": med,
               "median_step_s": statistics.median([x for r in per[m] for x in r[1]]),
               "period_min_s": min(pooled[m]), "period_max_s": max(pooled[m]),
               "samples": len(pooled[m])}
        if m != "off":
            ratios = [100 * (statistics.median(a) / statistics.median(b) - 1)
                      for a, b in zip([r[0] for r in per[m]], off_rounds)]
            lo, hi = bootstrap_median(ratios)
            row.update({"overhead_pct": statistics.median(ratios),
                        "ci95_pct": [lo, hi],
                        "pooled_overhead_pct": 100 * (med / off_med - 1),
                        "round_overheads_pct": ratios})
        res["modes"][m] = row
    return res


def print_table(res):
    print(f"{'mode':<14}{'median period s':>16}{'step_s':>9}{'overhead':>10}"
          f"{'95% CI':>20}{'rounds min..max':>20}{'pooled':>9}")
    for m, r in res["modes"].items():
        if m == "off":
            print(f"{m:<14}{r['median_period_s']:>16.4f}{r['median_step_s']:>9.4f}")
            continue
        lo, hi = r["ci95_pct"]
        rr = r["round_overheads_pct"]
        print(f"{m:<14}{r['median_period_s']:>16.4f}{r['median_step_s']:>9.4f}"
              f"{r['overhead_pct']:>9.2f}%{f'[{lo:+.2f}, {hi:+.2f}]%':>20}"
              f"{f'{min(rr):+.2f}..{max(rr):+.2f}%':>20}{r['pooled_overhead_pct']:>8.2f}%")
    if "series" in res:
        print(f"distinct series, bench-moe on {res['series_ranks']} ranks: {res['series']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build/moetron"))
    ap.add_argument("--compare-binary", default="")
    ap.add_argument("--series-ranks", type=int, default=0)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.steps < args.warmup + 3:
        raise SystemExit("monitor_overhead: --steps must exceed --warmup by 3 or more")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if os.geteuid() == 0:
        os.environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    runs = [(m, args.binary, MODES[m]) for m in MODES]
    if args.compare_binary:
        runs.append(("all@B", args.compare_binary, MODES["all"]))
    per = {name: [] for name, _, _ in runs}
    work = tempfile.mkdtemp(prefix="moetron-monitor-overhead-")
    try:
        for r in range(args.rounds):
            for name, binary, sets in runs[r % len(runs):] + runs[:r % len(runs)]:
                out = os.path.join(work, f"{name}-{r}")
                seen = timed_run(train_command(args, binary, out, sets), out + ".log")
                per[name].append((periods(seen, args.warmup, args.steps),
                                  step_s(out, args.warmup, args.steps)))
                shutil.rmtree(out)
                print(f"round {r + 1}/{args.rounds} {name}: median period "
                      f"{statistics.median(per[name][-1][0]):.4f} s", file=sys.stderr, flush=True)
        res = summarise(args, per)
        if args.compare_binary:
            res["compare_binary"] = args.compare_binary
        if args.series_ranks:
            res["series_ranks"] = args.series_ranks
            res["series"] = count_series(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(res)
    print(json.dumps(res))
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
