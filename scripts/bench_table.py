#!/usr/bin/env python3
"""Renders moetron_bench_kernels JSON as Markdown tables, one per family.

usage: scripts/bench_table.py RESULTS.json [FAMILY ...]
"""
import json
import sys
from collections import defaultdict


def main():
    rows = json.load(open(sys.argv[1]))
    families = sys.argv[2:]
    by_family = defaultdict(list)
    for r in rows:
        fam = r["name"].split("/")[0]
        if not families or fam in families:
            by_family[fam].append(r)
    for fam, rs in by_family.items():
        labels = sorted({k for r in rs for k in r["labels"] if k != "threads"})
        metrics = sorted({k for r in rs for k in r["metrics"]})
        print(f"\n#### {fam}\n")
        print("| case | threads | " + " | ".join(labels + metrics) + " |")
        print("|" + "---|" * (2 + len(labels) + len(metrics)))
        for r in rs:
            cells = [r["name"], r["labels"].get("threads", "")]
            cells += [r["labels"].get(k, "") for k in labels]
            for k in metrics:
                v = r["metrics"].get(k)
                cells.append("" if v is None else (f"{v:.3g}" if abs(v) < 1e5 else f"{v:.0f}"))
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
