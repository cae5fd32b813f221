#!/usr/bin/env python3
"""The GPU check's summary (scripts/gpu-check.sh): reads the gtest JSON
reports and the benchmark's JSON, writes one JSON summary, prints it, and
exits 0 only when every expected test ran and passed and the benchmark
finished. A skipped test counts as not run: on a GPU machine it must run."""
import argparse
import datetime
import json
import pathlib
import sys


def binary_result(reports: pathlib.Path, name: str, expected: int) -> dict:
    path = reports / f"{name}.json"
    if not path.exists():
        return {"expected": expected, "ran": 0, "passed": 0, "failed": [], "skipped": [],
                "error": "no report: the binary died or could not start"}
    data = json.loads(path.read_text())
    failed, skipped, passed = [], [], 0
    for suite in data.get("testsuites", []):
        for case in suite.get("testsuite", []):
            full = f"{suite['name']}.{case['name']}"
            if case.get("failures"):
                failed.append(full)
            elif case.get("result") == "SKIPPED" or case.get("status") == "NOTRUN":
                skipped.append(full)
            else:
                passed += 1
    ran = passed + len(failed) + len(skipped)
    res = {"expected": expected, "ran": ran, "passed": passed, "failed": failed,
           "skipped": skipped}
    if ran != expected:
        res["error"] = f"{ran} tests reported, {expected} expected"
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reports", required=True)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--bench-rc", type=int, required=True)
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    reports = pathlib.Path(a.reports)
    tests = {}
    for exp in sorted(reports.glob("*.expected")):
        name = exp.name[: -len(".expected")]
        tests[name] = binary_result(reports, name, int(exp.read_text().strip() or 0))
    bench_path = pathlib.Path(a.bench)
    bench = json.loads(bench_path.read_text()) if bench_path.exists() else None
    totals = {k: sum(len(t[k]) if isinstance(t[k], list) else t[k] for t in tests.values())
              for k in ("expected", "ran", "passed", "failed", "skipped")}
    problems = [f"{n}: {t['error']}" for n, t in tests.items() if "error" in t]
    problems += [f"{n}: failed {f}" for n, t in tests.items() for f in t["failed"]]
    problems += [f"{n}: skipped {s}" for n, t in tests.items() for s in t["skipped"]]
    if not tests:
        problems.append("no CUDA test was found in any test binary")
    if "comm_nccl_communicator_mpitest_np1" not in tests:
        problems.append("the NCCL communicator test did not run")
    if a.bench_rc != 0 or bench is None:
        problems.append(f"benchmark failed (exit {a.bench_rc})")
    summary = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": a.commit,
        "gpu": a.gpu,
        "ok": not problems,
        "problems": problems,
        "tests": totals,
        "per_binary": tests,
        "bench": bench,
    }
    pathlib.Path(a.out).write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=1))
    if problems:
        print("gpu-check: FAILED:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
