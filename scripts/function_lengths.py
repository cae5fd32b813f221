#!/usr/bin/env python3
"""Lengths of the function bodies in C++ sources, longest first.

A definition is a line at namespace or class scope that ends a signature
with `{` (after skipping comments and strings); its length runs to the
matching `}`. Lambdas and blocks inside a function count toward it.

  scripts/function_lengths.py [--max N] [--top K] DIR...
Exits non-zero when --max is given and a function is longer than N lines.
"""
import argparse
import os
import re
import sys

SIGNATURE = re.compile(r"[\w:~<>\]\)&*,\s]+\([^;]*\)\s*(const)?\s*(noexcept)?\s*(override)?\s*(->\s*[\w:<>&*\s]+)?\s*(:.*)?\{\s*$")
NOT_FUNCTION = re.compile(r"^\s*(if|for|while|switch|catch|do|else|return|namespace|class|struct|enum|union)\b")


def strip(line, in_comment):
    """The line without comments and string contents; whether a /* */ comment continues."""
    out, i = [], 0
    while i < len(line):
        if in_comment:
            end = line.find("*/", i)
            if end < 0:
                return "".join(out), True
            i, in_comment = end + 2, False
        elif line.startswith("//", i):
            break
        elif line.startswith("/*", i):
            in_comment, i = True, i + 2
        elif line[i] in "\"'":
            q, i = line[i], i + 1
            while i < len(line) and line[i] != q:
                i += 2 if line[i] == "\\" else 1
            out.append(q + q)
            i += 1
        else:
            out.append(line[i])
            i += 1
    return "".join(out), in_comment


def functions(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    depth, in_comment, scopes, found = 0, False, [], []
    pending = ""  # a signature spread over lines
    for n, raw in enumerate(lines, 1):
        code, in_comment = strip(raw, in_comment)
        in_function = any(kind == "function" for kind, _, _ in scopes)
        if not in_function:
            pending = (pending + " " + code.strip()).strip() if code.strip() else pending
        opens_function = (not in_function and code.rstrip().endswith("{") and SIGNATURE.match(pending)
                          and not NOT_FUNCTION.match(pending) and "=" not in pending.split("(")[0])
        for ch in code:
            if ch == "{":
                kind = "function" if opens_function and not in_function else "block"
                if kind == "function":
                    name = re.sub(r"\s*\(.*", "", pending).split()[-1] if pending.split() else "?"
                    scopes.append((kind, name, n))
                    in_function = True
                else:
                    scopes.append((kind, "", n))
            elif ch == "}" and scopes:
                kind, name, start = scopes.pop()
                if kind == "function":
                    found.append((n - start + 1, path, start, name))
        if not in_function and (code.rstrip().endswith((";", "{", "}")) or not code.strip()):
            pending = ""
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--max", type=int, default=0)
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    found = []
    for d in a.dirs:
        for root, _, files in os.walk(d):
            for f in files:
                if f.endswith((".cpp", ".h", ".cu", ".cuh")):
                    found += functions(os.path.join(root, f))
    found.sort(reverse=True)
    for length, path, line, name in found[: a.top]:
        print(f"{length:5d}  {path}:{line}  {name}")
    over = [f for f in found if a.max and f[0] > a.max]
    print(f"{len(found)} functions; {sum(1 for f in found if f[0] > 100)} over 100 lines, "
          f"{sum(1 for f in found if f[0] > 150)} over 150")
    if over:
        print(f"error: {len(over)} functions longer than {a.max} lines", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
