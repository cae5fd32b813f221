#!/usr/bin/env python3
"""Reads the metrics.jsonl of multimodal runs and reports what issue 21 asks
of them (bench/multimodal_compare.sh runs the training and calls this).

balancing: per task, the steps to close half (and 90%) of the gap between
  its initial loss (the first step it drew samples in) and its final loss
  (the mean of the last --window steps it drew samples in), on its loss
  curve smoothed by a trailing mean of --smooth steps (short: the halfway
  point falls within the first ~100 steps, and a long mean would lag it);
  the spread of a run is max - min of those steps over the tasks. Also the
  final task weights.
routing: per task (and "all": the step's logged loss, the mean cross-entropy
  over every target token of the step), the final loss (mean of the last --window steps) and the
  first step at which the loss, smoothed over --window steps, reaches the
  reference run's final loss; "vs reference" divides that step by the
  reference's own (the same smoothing reaches its own final before its last
  step, by noise and lag, so the ratio and not the raw step is compared with
  the issue's 0.75); per modality, the entropy of its expert load over the
  last --window steps (nats, mean over layers, with the maximum log(usable
  experts)); collapse events: per layer, modality and window of --window
  steps, an expert the modality may use that got < 1% or > 50% of the
  modality's expert choices in the window.

summary: the JSON files the two modes wrote for several seeds, as the mean
  and range over the seeds of each run's figures.

Usage:
  multimodal_curves.py balancing NAME=RUN_DIR ... [--window 50] [--smooth 10] [--json F]
  multimodal_curves.py routing NAME=RUN_DIR ... --reference NAME [--window 50]
  multimodal_curves.py summary FILE.json ...
"""
import argparse
import json
import math
import sys

MODALITIES = ["text", "image", "audio"]


def read_steps(run_dir):
    steps = []
    with open(run_dir + "/metrics.jsonl") as f:
        for line in f:
            d = json.loads(line)
            if "task_loss" in d and not d.get("skipped", False):
                steps.append(d)
    if not steps:
        sys.exit(f"multimodal_curves.py: {run_dir}/metrics.jsonl has no training steps")
    return steps


def task_series(steps, with_total=False):
    """task -> [(step, loss)] over the steps that drew the task ("all": the step's loss)."""
    out = {}
    for d in steps:
        if with_total:
            out.setdefault("all", []).append((d["step"], d["loss"]))
        for task, loss in d["task_loss"].items():
            if loss is not None and math.isfinite(loss):
                out.setdefault(task, []).append((d["step"], loss))
    return out


def smoothed(series, window):
    """[(step, trailing mean of the last `window` losses)]."""
    out, acc = [], 0.0
    for i, (step, loss) in enumerate(series):
        acc += loss
        if i >= window:
            acc -= series[i - window][1]
        out.append((step, acc / min(i + 1, window)))
    return out


def first_step_at_or_below(curve, level):
    for step, value in curve:
        if value <= level:
            return step
    return None


def final_loss(series, window):
    return sum(loss for _, loss in series[-window:]) / len(series[-window:])


def gap_steps(series, window, smooth, fraction):
    """Steps until the smoothed loss closes `fraction` of the initial-to-final gap."""
    initial, final = series[0][1], final_loss(series, window)
    level = initial - fraction * (initial - final)
    return first_step_at_or_below(smoothed(series, smooth), level), initial, final


def balancing(runs, window, smooth):
    report = {}
    for name, steps in runs.items():
        per_task = {}
        for task, series in sorted(task_series(steps).items()):
            half, initial, final = gap_steps(series, window, smooth, 0.5)
            ninety, _, _ = gap_steps(series, window, smooth, 0.9)
            per_task[task] = {"initial": initial, "final": final,
                              "steps_to_half_gap": half, "steps_to_90pct_gap": ninety}

        def spread(key):
            vals = [t[key] for t in per_task.values()]
            return None if None in vals else max(vals) - min(vals)

        report[name] = {"tasks": per_task, "spread_half": spread("steps_to_half_gap"),
                        "spread_90pct": spread("steps_to_90pct_gap"),
                        "final_weights": steps[-1].get("task_weight", {}),
                        "steps": steps[-1]["step"]}
    return report


def usable(owners, layer, modality, experts):
    """Experts a modality may use at one step: all, or (partitioned) its own and the shared."""
    if owners is None:
        return list(range(experts))
    return [j for j, o in enumerate(owners[layer]) if o in (-1, modality)]


def load_statistics(steps, window):
    layers = len(steps[-1]["expert_load_by_modality"])
    experts = len(steps[-1]["expert_load_by_modality"][0][0])
    entropy = {m: [] for m in range(len(MODALITIES))}
    events = 0
    windows = [steps[i:i + window] for i in range(0, len(steps) - window + 1, window)]
    for w_index, chunk in enumerate(windows):
        for layer in range(layers):
            for m in range(len(MODALITIES)):
                counts = [0] * experts
                for d in chunk:
                    for j, c in enumerate(d["expert_load_by_modality"][layer][m]):
                        counts[j] += c
                total = sum(counts)
                if total == 0:
                    continue
                allowed = usable(chunk[-1].get("expert_owners"), layer, m, experts)
                shares = [counts[j] / total for j in allowed]
                events += sum(1 for s in shares if s < 0.01 or s > 0.5)
                if w_index == len(windows) - 1:
                    h = -sum(s * math.log(s) for s in shares if s > 0)
                    entropy[m].append((h, math.log(len(allowed))))
    return {MODALITIES[m]: {"entropy": sum(h for h, _ in v) / len(v),
                            "max_entropy": sum(x for _, x in v) / len(v)}
            for m, v in entropy.items() if v}, events, len(windows)


def routing(runs, window, reference):
    if reference not in runs:
        sys.exit(f"multimodal_curves.py: --reference {reference} is not one of {list(runs)}")
    ref_series = task_series(runs[reference], True)
    ref_final = {task: final_loss(series, window) for task, series in ref_series.items()}
    ref_reach = {task: first_step_at_or_below(smoothed(series, window), ref_final[task])
                 for task, series in ref_series.items()}
    report = {}
    for name, steps in runs.items():
        total = steps[-1]["step"]
        per_task = {}
        for task, series in sorted(task_series(steps, True).items()):
            final = final_loss(series, window)
            reach = first_step_at_or_below(smoothed(series, window), ref_final[task])
            per_task[task] = {"final": final, "reference_final": ref_final[task],
                              "steps_to_reference_final": reach,
                              "fraction_of_steps": None if reach is None else reach / total,
                              "vs_reference": None if reach is None else reach / ref_reach[task]}
        entropy, events, n_windows = load_statistics(steps, window)
        moves = sum(len(d.get("modality_moves", [])) for d in steps)
        report[name] = {"tasks": per_task, "load_entropy": entropy, "collapse_events": events,
                        "windows": n_windows, "allocation_moves": moves, "steps": total}
    return report


def print_balancing(report):
    print("| run | task | initial | final | steps to half the gap | to 90% |")
    print("|---|---|---:|---:|---:|---:|")
    for name, r in report.items():
        for task, t in r["tasks"].items():
            print(f"| {name} | {task} | {t['initial']:.3f} | {t['final']:.3f} | "
                  f"{t['steps_to_half_gap']} | {t['steps_to_90pct_gap']} |")
    print()
    print("| run | spread, half the gap (steps) | spread, 90% (steps) | final weights |")
    print("|---|---:|---:|---|")
    for name, r in report.items():
        w = ", ".join(f"{k} {v:.2f}" for k, v in r["final_weights"].items())
        print(f"| {name} | {r['spread_half']} | {r['spread_90pct']} | {w} |")


def print_routing(report):
    print("| run | task | final loss | steps to the reference's final | vs reference |")
    print("|---|---|---:|---:|---:|")
    for name, r in report.items():
        for task, t in r["tasks"].items():
            ratio = "not reached" if t["vs_reference"] is None else f"{t['vs_reference']:.2f}"
            print(f"| {name} | {task} | {t['final']:.3f} | {t['steps_to_reference_final']} "
                  f"| {ratio} |")
    print()
    print("| run | load entropy text / image / audio (nats; max) | collapse events "
          "(windows) | allocation moves |")
    print("|---|---|---:|---:|")
    for name, r in report.items():
        ent = " / ".join(f"{v['entropy']:.2f}" for v in r["load_entropy"].values())
        mx = " / ".join(f"{v['max_entropy']:.2f}" for v in r["load_entropy"].values())
        print(f"| {name} | {ent} ({mx}) | {r['collapse_events']} ({r['windows']}) "
              f"| {r['allocation_moves']} |")


def spread_of(values):
    vals = [v for v in values if v is not None]
    if not vals:
        return "not reached"
    if all(isinstance(v, int) for v in vals):  # step counts and events
        text = f"{sum(vals) / len(vals):.1f} ({min(vals)}-{max(vals)})"
    else:
        text = f"{sum(vals) / len(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})"
    missing = len(values) - len(vals)
    return text + (f", {missing} not reached" if missing else "")


def summary(files):
    reports = [json.load(open(f)) for f in files]
    modes = {r["mode"] for r in reports}
    if len(modes) != 1:
        sys.exit(f"multimodal_curves.py summary: files of different modes {sorted(modes)}")
    runs = reports[0]["runs"].keys()
    print(f"{len(reports)} seeds: mean (min-max)")
    if modes == {"balancing"}:
        print("| run | spread, half the gap (steps) | spread, 90% (steps) |")
        print("|---|---:|---:|")
        for name in runs:
            half = spread_of([r["runs"][name]["spread_half"] for r in reports])
            ninety = spread_of([r["runs"][name]["spread_90pct"] for r in reports])
            print(f"| {name} | {half} | {ninety} |")
        return
    print("| run | task | final loss | steps to the reference's final, vs the reference |")
    print("|---|---|---:|---:|")
    for name in runs:
        for task in reports[0]["runs"][name]["tasks"]:
            t = [r["runs"][name]["tasks"][task] for r in reports]
            print(f"| {name} | {task} | {spread_of([x['final'] for x in t])} | "
                  f"{spread_of([x['vs_reference'] for x in t])} |")
    print()
    print("| run | load entropy text / image / audio (nats) | collapse events | moves |")
    print("|---|---|---:|---:|")
    for name in runs:
        rs = [r["runs"][name] for r in reports]
        ent = " / ".join(spread_of([x["load_entropy"][m]["entropy"] for x in rs])
                         for m in rs[0]["load_entropy"])
        print(f"| {name} | {ent} | {spread_of([x['collapse_events'] for x in rs])} | "
              f"{spread_of([x['allocation_moves'] for x in rs])} |")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "summary":
        summary(sys.argv[2:])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["balancing", "routing"])
    ap.add_argument("runs", nargs="+", help="NAME=RUN_DIR")
    ap.add_argument("--window", type=int, default=50)
    ap.add_argument("--smooth", type=int, default=10)
    ap.add_argument("--reference", default="shared")
    ap.add_argument("--json")
    a = ap.parse_args()
    runs = {}
    for spec in a.runs:
        if "=" not in spec:
            sys.exit(f"multimodal_curves.py: '{spec}' is not NAME=RUN_DIR")
        name, path = spec.split("=", 1)
        runs[name] = read_steps(path)
    if a.mode == "balancing":
        report = balancing(runs, a.window, a.smooth)
        print_balancing(report)
    else:
        report = routing(runs, a.window, a.reference)
        print_routing(report)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"mode": a.mode, "window": a.window, "smooth": a.smooth, "runs": report},
                      f, indent=1)


if __name__ == "__main__":
    main()
