"""Cost of ``import accelerando`` in a process that already imported torch.

Each repetition starts a fresh interpreter that imports torch, then times ``import accelerando``
(and, for comparison, the first ``Accelerator`` attribute access). Prints medians and the modules the
import added.

    python benchmarks/bench_import.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
import torch
before = set(sys.modules)
t0 = time.perf_counter()
import accelerando
t1 = time.perf_counter()
added = sorted(set(sys.modules) - before)
t2 = time.perf_counter()
accelerando.Accelerator
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "added": added, "accelerator_attr": t3 - t2}))
"""


def main(reps: int = 15) -> None:
    results = [
        json.loads(
            subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True).stdout
        )
        for _ in range(reps)
    ]
    imp = statistics.median(r["import"] for r in results)
    attr = statistics.median(r["accelerator_attr"] for r in results)
    print(f"import accelerando after torch: median {imp * 1e3:.2f} ms over {reps} fresh processes")
    print(f"modules added: {len(results[0]['added'])} {results[0]['added']}")
    print(f"first access of accelerando.Accelerator (loads the facade): median {attr * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
