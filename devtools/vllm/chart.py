"""The chart of `bench_pool.py`'s JSON: each workload's time over vLLM's pool and over kvsched's,
and how much of it the pool itself takes (an SVG through `kvsched.charts`).

    python -m devtools.vllm.chart BENCH.json OUT.svg      (from the checkout, any Python 3.11)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from kvsched.charts import BarChart


def chart(bench: dict[str, Any]) -> BarChart:
    rows = bench["rows"]
    assert isinstance(rows, list)
    return BarChart(
        title=f"vLLM's KVCacheManager over vLLM's pool and over kvsched's ({bench['measured']['date']})",
        unit="µs per decode step (W1) or admitted request (W2), log scale",
        groups=[str(row["case"]) for row in rows],
        series={
            "vLLM's pool": [float(row["stock"]) for row in rows],
            "kvsched's pool": [float(row["kvsched"]) for row in rows],
            "in vLLM's pool": [float(row["stock_in_pool"]) for row in rows],
            "in kvsched's pool": [float(row["kvsched_in_pool"]) for row in rows],
        },
        log_scale=True,
    )


def main(argv: list[str] | None = None) -> int:
    source, target = argv or sys.argv[1:]
    chart(json.loads(Path(source).read_text())).write(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
