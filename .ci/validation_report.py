"""The validation suite's report (Markdown) from pytest's JUnit XML: python validation_report.py XML SECONDS STATUS."""

import sys
import xml.etree.ElementTree as ET


def main(path, seconds, status):
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = {"failure": "FAILED", "error": "ERROR", "skipped": "skipped"}[tag]
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        cases.append((name, float(case.get("time", 0.0)), outcome))
    counts = {o: sum(1 for c in cases if c[2] == o) for o in ("passed", "FAILED", "ERROR", "skipped")}
    minutes, rest = divmod(int(seconds), 60)
    verdict = "PASSED" if int(status) == 0 else f"FAILED (pytest exit {status})"
    lines = ["# Validation suite", "",
             f"{verdict}: {counts['passed']} passed, {counts['FAILED']} failed, {counts['ERROR']} errors, "
             f"{counts['skipped']} skipped in {minutes} min {rest} s", "",
             "| test | seconds | outcome |", "|---|---:|---|"]
    lines += [f"| `{n}` | {t:.1f} | {o} |" for n, t, o in sorted(cases, key=lambda c: -c[1])]
    print("\n".join(lines))


if __name__ == "__main__":
    main(*sys.argv[1:4])
