"""Evals of the nemo-mbridge-perf-megatron-fsdp skill: cases, transcript reader, grader, runner, report.

Run as ``python3 -m evals validate|grade|run|report`` from the skill root.

* ``evals.json`` (+ ``evals.schema.json``): the cases, in NVIDIA's six-key format;
* ``transcripts``: reads Claude Code ``stream-json`` and Codex ``exec --json`` into one shape;
* ``checks``: per-case facts, searched in the final answer only; ``budgets.json``: efficiency budgets;
* ``grader``: ``grade(case, transcript, agent=None) -> dict`` on the five dimensions;
* ``runner`` (role evalse2e): runs the real agent CLIs; ``report``: BENCHMARK tables from its results.

Standard library only, except ``validate`` (jsonschema, imported lazily).
"""
