#!/usr/bin/env python3
"""Training entry for the GPU smoke test and the strategy benchmark (run under torchrun).

``mfsdp.py smoke`` and ``benchmarks/bench_strategies.py`` launch this file with the real launcher
(``python -m torch.distributed.run ...``); ``tests/gpu/test_smoke_gpu.py`` calls
``mfsdp_gpu.smoke.run`` in-process from pytest ranks started the same way, so one code path serves
the user-facing command, the pytest criterion and the benchmark. What a run does and why is
explained in ``scripts/mfsdp_gpu/smoke.py``. Every rank writes ``rank<R>.json`` into ``--out``.
"""

from __future__ import annotations

import os
import sys

sys.dont_write_bytecode = True  # no unsigned .pyc in the skill folder (see SECURITY.md)
sys.pycache_prefix = os.path.join(os.devnull, "no-bytecode")  # and none read from its __pycache__

_HERE = os.path.dirname(os.path.realpath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from mfsdp_gpu.smoke import main  # noqa: E402  (after the bytecode settings and the path)

if __name__ == "__main__":
    sys.exit(main())
