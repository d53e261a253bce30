"""The verdict of a schemathesis run from its JUnit report: server errors (5xx answers, timeouts, dropped
connections) fail it; errors inside schemathesis itself are listed but do not.

    python scripts/fuzz_verdict.py OUT_DIR --exit-status N
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

SERVER_SIDE = ("timed out", "timeout", "connection", "server error", "5xx", "status code 5")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder schemathesis wrote its JUnit report to")
    parser.add_argument("--exit-status", type=int, default=0, help="schemathesis' own exit status")
    args = parser.parse_args()
    reports = sorted(args.out.glob("*.xml"))
    if not reports:
        print(f"no JUnit report in {args.out}: schemathesis did not finish", file=sys.stderr)
        return args.exit_status or 1
    cases = server = 0
    tool: list[str] = []
    for report in reports:
        for case in ET.parse(report).getroot().iter("testcase"):
            cases += 1
            for problem in [*case.iter("failure"), *case.iter("error")]:
                text = f"{problem.get('message', '')} {problem.text or ''}".lower()
                if problem.tag == "failure" or any(s in text for s in SERVER_SIDE):
                    server += 1
                else:
                    tool.append(f"{case.get('name')}: {problem.get('message', '')[:160]}")
    print(f"fuzz verdict: {cases} operations, {server} server-side failures, {len(tool)} errors inside schemathesis")
    for line in tool:
        print(f"  schemathesis error (not a server response): {line}")
    return 1 if server else 0


if __name__ == "__main__":
    sys.exit(main())
