#!/usr/bin/env python3
"""Rehearse a Megatron-Bridge training job on ONE GPU as one rank of a world of N.

The entry point ``mfsdp.py rehearse`` and ``benchmarks/bench_rehearse.py`` start, one process per
rehearsal: ``python3 scripts/rehearse_train.py --help`` lists the options. What it does and why
is explained in ``scripts/mfsdp_gpu/rehearse.py``; the work is done by that package (one module per
concern: set-up, the fake world, collectives, measurement, reports). It writes ``report.json``
(schema ``rehearse-run/1``) into ``--out``. Exit status: 0 all phases passed, 1 a phase failed,
2 refused (bad input, no CUDA, no Megatron-Bridge).
"""

from __future__ import annotations

import os
import sys

sys.dont_write_bytecode = True  # no unsigned .pyc in the skill folder (see SECURITY.md)
sys.pycache_prefix = os.path.join(os.devnull, "no-bytecode")  # and none read from its __pycache__

_HERE = os.path.dirname(os.path.realpath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from mfsdp_gpu.rehearse import main  # noqa: E402  (after the bytecode settings and the path)

if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave at once: the report is written, and interpreter shutdown can wait on
    # data-loader workers or communicator teardown of a half-initialised job.
    os._exit(code)
