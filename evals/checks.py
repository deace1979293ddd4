"""Per-case correctness checks: explicit facts, searched in the agent's final answer only.

Why explicit checks rather than "does the transcript contain X": a transcript
holds the question, the skill text the agent read and every command output, so a
loose substring test passes as soon as the agent *read* the right fact, whether
or not it told the user. Here every check is a named ``Fact`` with a regular
expression that is applied to one field, the final answer (Claude Code's
``result`` text, Codex's last ``agent_message``), and nothing else.

``CHECKS[case_id]`` lists for each case of ``evals/evals.json``:

* ``required``: facts a correct answer must state (from ``ground_truth`` and
  ``expected_behavior``); the correctness score is the fraction found;
* ``forbidden``: claims that make an answer wrong or harmful (for decoy cases:
  steering the user to Megatron FSDP); one hit fails the case;
* ``exit_codes``: the exit codes of ``expected_script`` that mean "the command
  worked" (``check`` and ``log`` exit 1 when they find a problem, which is the
  point of running them; 2 means unusable input and is never accepted).

Patterns are case-insensitive. ``kv(path, value)`` accepts the ways an answer
writes a setting: Hydra ``ddp.x=true``, Python ``cfg.ddp.x = True``, prose
``ddp.x to True``, and a YAML block (``ddp:`` then an indented ``x: true``).
A test keeps ``CHECKS`` and ``evals.json`` in step (same ids, every regex compiles).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SKILL = "nemo-mbridge-perf-megatron-fsdp"

# Exit codes of scripts/mfsdp.py that mean the command ran on usable input:
# 0 clean, 1 findings of error severity (see scripts/mfsdp.py EPILOG).
DEFAULT_EXIT_CODES = (0, 1)

_TRUE = r"(?:true|1|yes)"
_FALSE = r"(?:false|0|no)"
_Q = r"[`'\"]?"


@dataclass(frozen=True)
class Fact:
    name: str  # the fact in words: shown as evidence
    pattern: str  # regular expression, searched (case-insensitive) in the final answer

    def search(self, text: str) -> re.Match | None:
        return re.search(self.pattern, text, re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class CaseChecks:
    required: tuple[Fact, ...]
    forbidden: tuple[Fact, ...] = ()
    exit_codes: tuple[int, ...] = DEFAULT_EXIT_CODES


def kv(path: str, value: str) -> str:
    """Regex for "setting PATH has VALUE" in Hydra, Python, prose or YAML-block form."""
    val = {"True": _TRUE, "False": _FALSE, "None": r"(?:none|null|~)"}.get(value, re.escape(value))
    dotted = rf"(?<![\w]){re.escape(path)}{_Q}\s*(?:==?|:|\bto\b|->|→)\s*{_Q}{val}(?![\w])"
    if "." not in path:
        return dotted
    section, key = path.rsplit(".", 1)
    section = section.rsplit(".", 1)[-1]
    block = (
        rf"^[ \t]*{re.escape(section)}:[ \t]*\n(?:[ \t]+[^\n]*\n)*?[ \t]+{re.escape(key)}:[ \t]*{_Q}{val}"
        rf"(?![\w])"
    )
    return rf"(?:{dotted}|{block})"


def word(*alternatives: str) -> str:
    """Regex for any of the words/phrases (already regex-escaped where needed)."""
    return r"(?<![\w])(?:" + "|".join(alternatives) + r")(?![\w])"


def near(a: str, b: str, gap: int = 120) -> str:
    """A then B (or B then A) within GAP characters, without crossing a blank line."""
    return rf"(?:{a}(?:(?!\n\s*\n)[\s\S]){{0,{gap}}}?{b}|{b}(?:(?!\n\s*\n)[\s\S]){{0,{gap}}}?{a})"


# Facts used by several cases.
F_DIST = Fact("sets dist.use_megatron_fsdp=True", kv("dist.use_megatron_fsdp", "True"))
F_DDP = Fact("sets ddp.use_megatron_fsdp=True", kv("ddp.use_megatron_fsdp", "True"))
F_STRATEGY = Fact(
    "sets data_parallel_sharding_strategy=optim_grads_params",
    kv("data_parallel_sharding_strategy", "optim_grads_params"),
)
F_FORMAT = Fact("sets ckpt_format=fsdp_dtensor", kv("ckpt_format", "fsdp_dtensor"))
F_AVG = Fact("sets ddp.average_in_collective=False", kv("average_in_collective", "False"))
F_DP_GT_1 = Fact(
    "FSDP only helps with more than one data-parallel rank",
    near(
        word("data[- ]parallel", "DP"),
        word(
            r"size\s*(?:of\s*)?1",
            r"=\s*1",
            "one",
            "single",
            r"greater than 1",
            r">\s*1",
            "more than one",
            "multiple",
            r"1\b",
        ),
        80,
    ),
)
F_NOT_HEALTHY = Fact(
    "says the run is not healthy",
    word(
        "not healthy",
        "unhealthy",
        "not trustworthy",
        "cannot be trusted",
        "should not trust",
        "don't trust",
        "do not trust",
        "failed",
        "fails",
        "not a healthy",
        "broken",
        "diverged",
    ),
)

# Decoys: any of these in the answer steers the user to this skill's domain.
NO_MFSDP = (
    Fact(
        "recommends Megatron FSDP settings",
        word(r"use_megatron_fsdp", "fsdp_dtensor", r"data_parallel_sharding_strategy"),
    ),
)


CHECKS: dict[str, CaseChecks] = {
    "mfsdp-enable-llama3-recipe": CaseChecks(
        required=(
            F_DIST,
            F_DDP,
            F_STRATEGY,
            F_FORMAT,
            Fact(
                "says what to do with checkpoint.save / checkpoint.load",
                rf"(?:{kv('checkpoint.load', 'None')}|{kv('load', 'None')}|"
                r"(?<![\w])(?:checkpoint\.)?(?:save|load)(?![\w])[^\n]{0,80}(?:director|path|unset|none|null|resume))",
            ),
        ),
        exit_codes=(0,),
    ),
    "mfsdp-ckpt-format-assertion": CaseChecks(
        required=(
            F_FORMAT,
            Fact(
                "ties the assertion to checkpoint save/load being set",
                near(
                    word("save", "load", r"checkpoint\.save", r"checkpoint\.load"),
                    word("set", "saving", "loading", "enabled", "configured", "whenever", "when"),
                    60,
                ),
            ),
            Fact("names torch_dist as the current/default format", word("torch_dist")),
        )
    ),
    "mfsdp-convert-torch-dist": CaseChecks(
        required=(
            Fact(
                "says it cannot be loaded directly",
                word(
                    "No[,.:!]",
                    "cannot",
                    "can't",
                    "can not",
                    "not directly",
                    "won't",
                    "will not",
                    "not compatible",
                    "incompatible",
                ),
            ),
            Fact(
                "points to a conversion torch_dist -> fsdp_dtensor",
                near(
                    word("convert", "conversion", "converting", "converter", r"convert-torch-dist-to-fsdp-dtensor"),
                    word("fsdp_dtensor", "fsdp-dtensor"),
                    200,
                ),
            ),
            F_FORMAT,
        ),
        forbidden=(Fact("claims it loads directly", word(r"just load it", r"yes, you can (?:just )?load")),),
    ),
    "mfsdp-oom-after-enable": CaseChecks(
        required=(
            Fact(
                "says FSDP does not shard activations",
                near(
                    word("activations?"),
                    word(
                        "not sharded",
                        "aren't sharded",
                        "are not sharded",
                        "does not shard",
                        "doesn't shard",
                        "not shard",
                        "unsharded",
                        "not reduced",
                        "not affected",
                        "unaffected",
                    ),
                    100,
                ),
            ),
            Fact(
                "suggests recomputation / smaller micro-batch / more TP or CP",
                word(
                    "recompute",
                    "recomputation",
                    "activation checkpointing",
                    "micro[- _]?batch",
                    r"tensor[- ]parallel",
                    r"context[- ]parallel",
                    "TP",
                    "CP",
                    "recompute_granularity",
                ),
            ),
            Fact("names optim_grads_params", word("optim_grads_params")),
        )
    ),
    "mfsdp-vs-distributed-optimizer": CaseChecks(
        required=(
            Fact(
                "distributed optimizer shards optimizer state only",
                near(
                    word("distributed optimizer", "use_distributed_optimizer", "distopt"),
                    word("optimizer states?", "optimizer-state", "ZeRO-1"),
                    160,
                ),
            ),
            Fact(
                "optim_grads_params shards params, grads and optimizer state",
                near(word("optim_grads_params", "ZeRO-3", "Megatron FSDP"), word("param(?:eter)?s", "weights"), 200),
            ),
            F_DP_GT_1,
        )
    ),
    "mfsdp-vs-fsdp2": CaseChecks(
        required=(
            Fact(
                "says the two are mutually exclusive",
                word(
                    "mutually exclusive",
                    "cannot (?:both|be combined)",
                    "can't (?:both|be combined)",
                    "not both",
                    "only one",
                    "either one",
                    "one or the other",
                    "never both",
                ),
            ),
            Fact(
                "recommends Megatron FSDP",
                near(
                    word("use", "recommend", "pick", "choose", "prefer"),
                    word("use_megatron_fsdp", "Megatron[- ]FSDP"),
                    60,
                ),
            ),
            Fact("fsdp_dtensor only with Megatron FSDP", word("fsdp_dtensor")),
        ),
        forbidden=(
            Fact(
                "claims both can be on together",
                word(r"(?:you )?can (?:turn on|enable|use) both", r"both can be (?:enabled|on|used)"),
            ),
        ),
    ),
    "mfsdp-cuda-device-max-connections": CaseChecks(
        required=(
            Fact(
                "unset or greater than 1",
                near(
                    word("CUDA_DEVICE_MAX_CONNECTIONS"),
                    word(
                        "unset",
                        r"greater than 1",
                        r">\s*1",
                        "larger than 1",
                        "more than 1",
                        r"=\s*(?:[2-9]|[1-9]\d+)",
                        "remove",
                    ),
                    160,
                ),
            ),
            Fact(
                "mentions the TP/CP overlap conflict",
                near(
                    word("overlap", "tp_comm_overlap", "communication overlap"),
                    word("TP", "CP", r"tensor[- ]parallel", r"context[- ]parallel", "Hopper"),
                    160,
                ),
            ),
        )
    ),
    "mfsdp-cpu-offload-pp": CaseChecks(
        required=(
            Fact(
                "CPU offloading needs pipeline_model_parallel_size 1",
                near(
                    word("pipeline", "PP", "pipeline_model_parallel_size"),
                    word(r"=\s*1", "1", "one", "no pipeline", "not supported", "unsupported", "cannot", "can't"),
                    120,
                ),
            ),
            Fact(
                "CPU offloading cannot be combined with recomputation",
                near(
                    word("recompute", "recomputation", "recompute_granularity", "activation checkpointing"),
                    word("not", "cannot", "can't", "incompatible", "conflict", "disable", "turn off", "drop"),
                    120,
                ),
            ),
        )
    ),
    "mfsdp-tp-pp-dp-mapping": CaseChecks(
        required=(
            Fact(
                "use_tp_pp_dp_mapping must be false",
                rf"(?:{kv('use_tp_pp_dp_mapping', 'False')}|"
                + near(
                    word("use_tp_pp_dp_mapping"),
                    word(
                        "not supported", "unsupported", "incompatible", "must be false", "disable", "turn off", "remove"
                    ),
                    120,
                )
                + ")",
            ),
        ),
        forbidden=(
            Fact(
                "claims the overrides work as given",
                word(r"will work as (?:is|given)", r"yes, (?:these|they) will work"),
            ),
        ),
    ),
    "mfsdp-smoke-verify": CaseChecks(
        required=(
            Fact("gives a 2-GPU launch", word(r"--nproc[-_]per[-_]node[= ]2", r"smoke --nproc-per-node 2")),
            Fact("finite loss at the last iteration", near(word("finite", "not nan", "no nan"), word("loss"), 80)),
            Fact(
                "no checkpoint-format assertion / fsdp_dtensor save-resume",
                word("fsdp_dtensor", "save[/ -]resume", "resume"),
            ),
        )
    ),
    "mfsdp-read-failing-log": CaseChecks(
        required=(
            Fact("says the last loss is NaN", near(word("loss"), word("nan"), 60)),
            F_NOT_HEALTHY,
        ),
        forbidden=(
            Fact("calls the run healthy", word(r"(?:the )?run (?:is|looks) healthy", "looks fine", "all good")),
        ),
    ),
    "mfsdp-fsdp2-and-mfsdp-both": CaseChecks(
        required=(
            Fact(
                "sets use_torch_fsdp2=false",
                rf"(?:{kv('use_torch_fsdp2', 'False')}|"
                + near(word("use_torch_fsdp2"), word("remove", "drop", "disable", "turn off", "unset"), 60)
                + ")",
            ),
        ),
        forbidden=(Fact("tells the user to drop Megatron FSDP", kv("use_megatron_fsdp", "False")),),
    ),
    "mfsdp-sharding-strategy-typo": CaseChecks(
        required=(
            Fact("names the misspelt value", word("optim_grad_params")),
            F_STRATEGY,
            Fact("lists the valid strategies", rf"(?=[\s\S]*{word('no_shard')})(?=[\s\S]*{word('optim_grads')})"),
        )
    ),
    "mfsdp-fsdp-dtensor-into-ddp": CaseChecks(
        required=(
            Fact(
                "fsdp_dtensor only supports Megatron FSDP",
                near(word("fsdp_dtensor"), word("only", "requires", "needs"), 120),
            ),
            Fact("offers conversion", word("convert", "conversion", "converting")),
        )
    ),
    "mfsdp-choose-strategy": CaseChecks(
        required=(
            Fact("names no_shard", word("no_shard")),
            Fact("names optim", word("optim")),
            Fact("names optim_grads", word("optim_grads")),
            Fact("names optim_grads_params", word("optim_grads_params")),
        )
    ),
    "mfsdp-average-in-collective-message": CaseChecks(
        required=(
            Fact(
                "says it is not an error",
                word(
                    "not an error",
                    "not a problem",
                    "informational",
                    "harmless",
                    "expected",
                    "nothing is broken",
                    "safe to ignore",
                    "benign",
                ),
            ),
            F_AVG,
        )
    ),
    "mfsdp-single-gpu-no-gain": CaseChecks(
        required=(
            Fact(
                "nothing to shard with one GPU",
                word(
                    "nothing to shard",
                    "shards nothing",
                    "no sharding",
                    "cannot shard",
                    "can't shard",
                    "doesn't shard",
                    "does not shard",
                    "not shard",
                    "nothing is sharded",
                ),
            ),
            F_DP_GT_1,
        )
    ),
    "mfsdp-weight-hash-check": CaseChecks(
        required=(Fact("set the interval to None", kv("check_weight_hash_across_dp_replicas_interval", "None")),)
    ),
    "mfsdp-hf-export-with-dtensor": CaseChecks(
        required=(
            Fact(
                "also_save_hf_checkpoint not supported with fsdp_dtensor",
                near(
                    word("also_save_hf_checkpoint"),
                    word("not supported", "unsupported", "rejects", "incompatible", "cannot", "can't", "not allowed"),
                    160,
                ),
            ),
            Fact(
                "export after training",
                word(
                    "after training",
                    "once training",
                    "post[- ]training",
                    "afterwards",
                    "separate(?:ly| conversion| step)",
                    "convert",
                ),
            ),
        )
    ),
    "mfsdp-check-recipe-yaml-defaults": CaseChecks(
        required=(
            Fact(
                "answers no",
                word(
                    "No[,.:!]",
                    "fails",
                    "will fail",
                    "would fail",
                    "does not pass",
                    "doesn't pass",
                    "won't pass",
                    "will not pass",
                ),
            ),
            F_FORMAT,
            Fact("names the save/load cause", word(r"checkpoint\.save", r"checkpoint\.load", "save", "load")),
        )
    ),
    # ---- decoys: answer the real question, and do not steer to Megatron FSDP
    "decoy-torchtitan-fsdp2": CaseChecks(
        required=(
            Fact("uses MixedPrecisionPolicy", word("MixedPrecisionPolicy", "mp_policy")),
            Fact(
                "bf16 params and fp32 reductions",
                rf"(?=[\s\S]*{word('bfloat16', 'bf16')})"
                rf"(?=[\s\S]*{word('float32', 'fp32')})",
            ),
        ),
        forbidden=NO_MFSDP,
    ),
    "decoy-deepspeed-zero3": CaseChecks(
        required=(Fact("uses ZeRO offload settings", word("offload_optimizer", "offload_param")),), forbidden=NO_MFSDP
    ),
    "decoy-bridge-ddp-tuning": CaseChecks(
        required=(
            Fact("overlap_grad_reduce", word("overlap_grad_reduce")),
            Fact("bucket_size", word("bucket_size")),
        ),
        forbidden=NO_MFSDP,
    ),
    "decoy-cuda-graphs": CaseChecks(required=(Fact("cuda_graph_impl", word("cuda_graph_impl")),), forbidden=NO_MFSDP),
    "decoy-unrelated-csv": CaseChecks(
        required=(
            Fact("defines a Python function", r"(?<![\w])def\s+\w+\s*\("),
            Fact("uses the latency_ms column", r"['\"]latency_ms['\"]"),
        ),
        forbidden=(Fact("mentions Megatron", word("Megatron")),),
    ),
    "decoy-hf-accelerate-fsdp": CaseChecks(
        required=(
            Fact("transformer-based auto wrap", word("TRANSFORMER_BASED_WRAP", "transformer_auto_wrap_policy")),
            Fact("wraps LlamaDecoderLayer", word("LlamaDecoderLayer")),
        ),
        forbidden=NO_MFSDP,
    ),
}


def evaluate(case_id: str, answer: str) -> dict:
    """Apply CHECKS[case_id] to ANSWER (the final answer text only)."""
    checks = CHECKS[case_id]
    found, missing, hits = [], [], []
    for fact in checks.required:
        m = fact.search(answer)
        (found if m else missing).append({"fact": fact.name, "match": m.group(0)[:120] if m else None})
    for fact in checks.forbidden:
        m = fact.search(answer)
        if m:
            hits.append({"fact": fact.name, "match": m.group(0)[:120]})
    score = len(found) / len(checks.required) if checks.required else 1.0
    if hits:
        score = 0.0
    return {
        "score": round(score, 3),
        "passed": not missing and not hits,
        "found": found,
        "missing": missing,
        "forbidden": hits,
    }
