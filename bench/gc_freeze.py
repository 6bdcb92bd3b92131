"""Garbage-collector freeze (`NVCF_GC_FREEZE`, core/server.py `freeze_startup_objects`): the pause
of one full collection in a process holding the built application, with the start-up objects
frozen and not, in the same run.

A full (generation 2) collection walks every tracked object; without the freeze those include
every module, class and function imported and the application built at start-up, so each one a
busy server makes while serving stops every request for that long. This builds the API
server's application (`create_app`, as `nvcf-server serve` does, in a temporary data
directory), then in alternating rounds times `gc.collect()` with the start-up objects frozen
(`gc.freeze()`) and unfrozen (`gc.unfreeze()`), and prints the median pause of each (CPU ms,
`time.process_time`), the rounds' spread and their difference; with the number of objects walked.
The whole-server figures (`bench/invoke.py --variant 'gc freeze off:NVCF_GC_FREEZE=false'`)
are in docs/architecture.md.

    .venv/bin/python bench/gc_freeze.py [--rounds 9]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def pause_ms() -> float:
    start = time.process_time()
    gc.collect()
    return (time.process_time() - start) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nvcf-bench-gc-") as tmp:
        os.environ["NVCF_DATA_DIR"] = tmp
        from service.app import create_app
        from service.core.settings import Settings

        app = create_app(Settings())
        gc.collect()
        tracked = len(gc.get_objects())
        frozen: list[float] = []
        unfrozen: list[float] = []
        for r in range(args.rounds):
            for freeze in (True, False) if r % 2 == 0 else (False, True):
                if freeze:
                    gc.freeze()
                    frozen.append(pause_ms())
                    gc.unfreeze()
                else:
                    unfrozen.append(pause_ms())
        del app
    saved = [a - b for a, b in zip(unfrozen, frozen, strict=True)]
    print(
        f"{args.rounds} alternating rounds; one full collection, CPU ms, medians [spread]; "
        f"{tracked} objects tracked once the application is built"
    )
    for name, values in (("frozen (NVCF_GC_FREEZE=true)", frozen), ("not frozen", unfrozen)):
        print(
            f"  {name:30} {statistics.median(values):8.2f} ms [{min(values):.2f}–{max(values):.2f}]"
        )
    # the frozen pause is near zero: a difference says more than a ratio
    print(
        f"  not frozen − frozen            {statistics.median(saved):8.2f} ms "
        f"[{min(saved):.2f}–{max(saved):.2f}] more per full collection"
    )


if __name__ == "__main__":
    main()
