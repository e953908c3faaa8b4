"""Write tests/module_costs.json from a full run's junit report: each test module's
seconds (its tests' durations, setup and teardown included), for conftest's ordering.

    python -m pytest --junitxml=junit.xml && python tests/module_costs.py junit.xml
"""

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def module_costs(junit: Path) -> dict[str, float]:
    costs: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        # "tests.unit.test_config" or "tests.unit.test_x.TestClass": up to the test_ module
        end = next((i for i, part in enumerate(parts) if part.startswith("test_")), None)
        if end is None:  # a collection error's entry ("tests.unit"): no module ran
            continue
        end += 1
        parts = parts[:end] if parts[0] == "tests" else ["tests", *parts[:end]]
        costs["/".join(parts) + ".py"] += float(case.get("time", 0))
    return {m: round(s, 1) for m, s in sorted(costs.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":
    out = Path(__file__).with_name("module_costs.json")
    out.write_text(json.dumps(module_costs(Path(sys.argv[1])), indent=1) + "\n")
    print(f"wrote {out}")
