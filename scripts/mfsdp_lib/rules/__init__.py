"""THE rule table: every Megatron FSDP constraint, checked all at once.

Bridge's ``ConfigContainer.validate()`` asserts on the first problem only, and some
constraints live outside it (Megatron-Core's DDP and Transformer configs, the
Megatron-FSDP wrapper, the environment). This package restates each one as a typed
record (``model.Rule``, keyword fields), so ``check`` reports every problem in one pass
and ``references/rules.md`` is generated from the same table.

Where a rule lives: one module per topic, listed in ``TOPICS`` below (core FSDP,
checkpoint, environment, parallel layout, MoE, precision, optimizer, PEFT, activations,
CUDA graphs). Search
for the rule id, or for the assert message quoted in its ``source``. To add a topic,
write ``rules/<topic>.py`` with a ``RULES`` list and add its name to ``TOPICS``.

``evaluate(cfg, env, gpu_arch)`` returns the findings. The predicates are plain
lambdas over dict look-ups: import cost is what keeps ``check`` within a few
interpreter start-ups, so there is no framework here.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from ..findings import Finding
from .context import (
    DIST_CKPT_FORMATS,
    GITHUB_ONLY,
    KNOWN_ARCHS,
    MAX_CONN,
    PRE_BLACKWELL_ARCHS,
    Eff,
    data_parallel,
    eval_batch_problem,
    fmt,
    min_world,
    moe_ep_overlap,
    normalize_arch,
    pp_size,
    raw_get,
    resolve_mixed_precision,
    train_batch_problem,
)
from .cuda_graphs import cuda_graph_needs_te_rng
from .model import SEVERITIES, STAGES, Rule

# The topic modules, in the order ``rules`` lists them (within one severity).
TOPICS = (
    "core",
    "checkpoint",
    "environment",
    "parallel",
    "moe",
    "precision",
    "optimizer",
    "peft",
    "activations",
    "cuda_graphs",
)


def _load() -> list[Rule]:
    table: list[Rule] = []
    for topic in TOPICS:
        module = importlib.import_module(f"{__name__}.{topic}")
        for rule in module.RULES:
            if rule.topic != topic:
                raise ValueError(f"{rule.id} is in rules/{topic}.py but says topic={rule.topic!r}")
            table.append(rule)
    # Errors first, then warnings, then info (stable: topic order, then the order in the module).
    table.sort(key=lambda r: SEVERITIES.index(r.severity))
    ids = [r.id for r in table]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(f"rule ids defined twice: {', '.join(dup)}")
    return table


RULES: list[Rule] = _load()

# Which recipe families and features the table was written for (README, ``check --help`` and
# references/rules.md all print ``coverage_text()``; references/families.md gives the details).
COVERED = (
    "dense GPT (Llama, Qwen, Gemma, Mistral ...)",
    "MLA (DeepSeek, Kimi)",
    "MoE and expert parallelism",
    "hybrid Mamba (Nemotron-H)",
    "VLM (the language model's settings)",
    "pipeline parallelism (refused with Megatron FSDP)",
    "PEFT (LoRA, DoRA)",
    "FP8 and MXFP8",
    "CUDA graphs",
    "optimizers (Adam, SGD; Muon refused)",
)
NOT_COVERED = (
    "FP4 (NVFP4) parameters with Megatron FSDP",
    "Megatron-MIMO",
    "diffusion recipes (FLUX, WAN)",
    "T5 / encoder-decoder models",
)


def coverage_text(width: int = 0) -> str:
    """One paragraph; wrapped at ``width`` columns when given (without textwrap: check's start-up stays lean)."""
    text = (
        f"Covered: {'; '.join(COVERED)}. Not covered (configs are read, no rule was written for them): "
        f"{'; '.join(NOT_COVERED)}. Details per family: references/families.md."
    )
    if not width:
        return text
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines)


RULES_BY_ID = {r.id: r for r in RULES}

__all__ = [
    "DIST_CKPT_FORMATS",
    "GITHUB_ONLY",
    "KNOWN_ARCHS",
    "MAX_CONN",
    "PRE_BLACKWELL_ARCHS",
    "RULES",
    "RULES_BY_ID",
    "STAGES",
    "TOPICS",
    "COVERED",
    "NOT_COVERED",
    "coverage_text",
    "Eff",
    "Rule",
    "data_parallel",
    "eval_batch_problem",
    "min_world",
    "train_batch_problem",
    "evaluate",
    "fmt",
    "moe_ep_overlap",
    "cuda_graph_needs_te_rng",
    "pp_size",
    "normalize_arch",
    "raw_get",
    "resolve_mixed_precision",
]


def evaluate(
    cfg: Mapping,
    env: Mapping[str, str],
    gpu_arch: str | None = None,
    world: int | None = None,
    world_how: str | None = None,
) -> list[Finding]:
    """Every finding for an effective config (``config_io.load_effective``) and environment.

    ``world``: the job's world size when known (``world_how`` says where it came from, for the messages);
    without it the batch-size rules judge at the smallest world the layout allows.
    """
    e = Eff(cfg, env, gpu_arch, world, world_how)
    found = []
    for r in RULES:
        try:
            hit = r.when(e)
        except (TypeError, ValueError, AttributeError):
            hit = False  # a value of an unexpected shape: config_io reports those as input errors
        if not hit:
            continue
        if isinstance(hit, list):  # a rule over many paths (enums): one finding per (path, message, fix)
            for path, message, fix in hit:
                found.append(Finding(r.id, r.severity, path, message, fix, {"stage": r.stage, "source": r.source}))
            continue
        fix = r.fix(e) if callable(r.fix) else r.fix
        if r.message is None or fix is None:  # only rules that return their own (path, message, fix) list
            raise ValueError(f"{r.id}: fired without a message or fix")
        found.append(
            Finding(r.id, r.severity, e.origin(r.paths[0]), r.message(e), fix, {"stage": r.stage, "source": r.source})
        )
    return found
