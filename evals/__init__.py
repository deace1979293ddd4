"""Evals of the nemo-mbridge-perf-megatron-fsdp skill: cases, transcript reader, grader, runner, report.

Run as ``python3 -m evals validate|grade|run|report`` from the skill root.

* ``evals.json`` (+ ``evals.schema.json``): the cases, in NVIDIA's six-key format;
* ``transcripts``: reads Claude Code ``stream-json`` and Codex ``exec --json`` into one shape;
* ``checks``: per-case settings, facts and forbidden claims on the final answer; ``budgets.json``: budgets;
* ``grader``: ``grade(case, transcript, agent=None) -> dict`` on the five dimensions;
* ``runner``: runs the real agent CLIs; ``report``: BENCHMARK tables from its results;
* ``shell``, ``settings``, ``security``: the structure the grader reads (commands, recommended settings, harm);
* ``cases``: ``evals.json`` read once; ``fixtures/``: the users' projects cases start in;
* ``adversarial``: the grader's false-pass / false-fail rates on the labelled set in ``tests/``.

Standard library only, except ``validate`` (jsonschema, imported lazily).
"""
