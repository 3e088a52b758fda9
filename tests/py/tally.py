"""The failed-check tally the Python tests share: check() prints and counts a failed check,
verdict() prints the test's result line and gives its exit status."""
import sys

failures = 0


def check(cond, msg):
    global failures
    if not cond:
        failures += 1
        print(f"FAIL: {msg}", file=sys.stderr)
    return cond


def verdict(name, detail=""):
    """`name: [detail, ]all checks passed` or `... N FAILED`; 1 when a check failed, else 0"""
    print(f"{name}: {detail}" + ("all checks passed" if not failures else f"{failures} FAILED"))
    return 1 if failures else 0
