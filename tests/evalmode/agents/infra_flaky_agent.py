"""httpx_agent.py, but a run listed in $OFFSCOPE_TEST_INFRA_RUNS (a file, one run id per
line) does its whole trajectory and then reports an infrastructure failure the documented
way: exit code 75 (EX_TEMPFAIL). Its calls crossed the proxy like any other run's, so a
grid that counted it would show it in n and in its rates."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from httpx_agent import main  # noqa: E402


def failing() -> set[str]:
    listed = os.environ.get("OFFSCOPE_TEST_INFRA_RUNS")
    if not listed or not Path(listed).exists():
        return set()
    return set(Path(listed).read_text(encoding="utf-8").split())


if __name__ == "__main__":
    code = main()
    sys.exit(75 if os.environ["OFFSCOPE_RUN_ID"] in failing() else code)
