"""Replaying real Bridge verdicts through our rule table (the differential check).

Role ``gpu`` records, on a machine where Megatron-Bridge imports, what the real
``runtime_config_update()`` said of many configs (``verdicts.json``: a base
``run_config.yaml``, then per case ``section.key=value`` overrides and an environment).
``replay`` runs each case through ``config_io`` and ``rules`` exactly as ``check``
would, with exactly the case's environment, and classifies the outcome:

* Bridge raised   -> ``agree`` when we report an error (or refuse the input), and
  ``exact`` when Bridge's message is one our table quotes and that rule fired;
* Bridge accepted -> ``agree`` when we report no error, or only errors of the
  documented stages (``runtime``: the job fails after validate; ``input``: a value
  Bridge stores unchecked, such as a misspelt enum).

Used by ``tests/rules/test_differential.py`` (which asserts full agreement) and by
``benchmarks/bench_differential.py`` (which records the figures).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .. import config_io, rules
from ..findings import InputError
from .context import MAX_CONN

# Error stages Bridge's validate() does not raise, by design: documented exceptions.
EXEMPT_STAGES = ("runtime", "input")
_QUOTE = re.compile(r"""(['"])(.{12,}?)\1""")


def load(path: str | Path) -> tuple[dict, Path]:
    """(verdicts document, path of its base config)."""
    path = Path(path)
    doc = json.loads(path.read_text(encoding="utf-8"))
    return doc, path.parent / doc["base_config"]


def quoted(rule) -> list[str]:
    """The messages a rule's source anchor quotes."""
    return [q for _, q in _QUOTE.findall(rule.source)]


def rules_quoting(message: str) -> set[str]:
    """Ids of the validate-stage rules whose quoted assert message is in Bridge's error text."""
    msg = " ".join((message or "").split())
    return {r.id for r in rules.RULES if r.stage == "validate" and any(" ".join(q.split()) in msg for q in quoted(r))}


def ours(base: Path, case: dict) -> tuple[list | None, str | None]:
    """(findings, None) or (None, input error) for one case, as ``check`` would judge it."""
    try:
        cfg = config_io.load_effective(str(base), case["overrides"])
    except InputError as exc:
        return None, str(exc)
    return rules.evaluate(cfg, dict(case.get("env") or {}), None), None


def replay(doc: dict, base: Path) -> list[dict]:
    """One record per case: Bridge's verdict, ours, and whether they agree."""
    out = []
    for case in doc["cases"]:
        verdict = case["bridge"]
        findings, err = ours(base, case)
        errors = sorted({f.rule for f in findings or () if f.severity == "error"})
        rec = {
            "id": case["id"],
            "bridge_ok": bool(verdict["ok"]),
            "bridge_error": verdict.get("error"),
            "input_error": err,
            "our_errors": errors,
            "expected_rules": [],
            "exact": None,
            "exempt": [],
        }
        if verdict.get("error_type") == "OverrideError":
            rec["agree"] = None  # the generator could not apply the case: no verdict to compare
        elif not verdict["ok"]:
            rec["agree"] = err is not None or bool(errors)
            expected = sorted(rules_quoting(verdict.get("error") or ""))
            rec["expected_rules"] = expected
            rec["exact"] = bool(expected) and bool(set(expected) & set(errors)) if err is None else None
            if expected and err is None and not rec["exact"]:
                rec["agree"] = False
        else:
            if err is not None:
                rec["exempt"] = ["input"] if "is not one of" in err else []
                rec["agree"] = bool(rec["exempt"])
            else:
                hard = [r for r in errors if rules.RULES_BY_ID[r].stage not in EXEMPT_STAGES]
                rec["exempt"] = [r for r in errors if r not in hard]
                rec["agree"] = not hard
        out.append(rec)
    return out


def summary(records: list[dict]) -> dict:
    rejected = [r for r in records if r["agree"] is not None and not r["bridge_ok"]]
    accepted = [r for r in records if r["agree"] is not None and r["bridge_ok"]]
    return {
        "cases": len(records),
        "bridge_rejected": len(rejected),
        "we_rejected_too": sum(1 for r in rejected if r["agree"]),
        "exact_rule": sum(1 for r in rejected if r["exact"]),
        "bridge_message_without_quote": sum(1 for r in rejected if not r["expected_rules"] and not r["input_error"]),
        "bridge_accepted": len(accepted),
        "we_accepted_too": sum(1 for r in accepted if r["agree"] and not r["exempt"]),
        "documented_exceptions": sum(1 for r in accepted if r["agree"] and r["exempt"]),
        "disagreements": sum(1 for r in records if r["agree"] is False),
        "no_verdict": sum(1 for r in records if r["agree"] is None),
    }


# ---------------------------------------------------------------------------------------------
# Fields for the differential test (tests/differential/gen_verdicts.py builds configs over these and asks real Bridge).
# Each entry: dotted path -> candidate values, invalid ones included. Values are YAML/Hydra
# spellings as they would appear in ``section.key=value`` overrides. Vary them over the
# base_run_config.yaml; keep parallel sizes fixed (one GPU: TP*PP*CP must divide world size 1).
DIFFERENTIAL_FIELDS: dict[str, list] = {
    "dist.use_megatron_fsdp": [True, False],
    "ddp.use_megatron_fsdp": [True, False],
    "ddp.data_parallel_sharding_strategy": [
        "no_shard",
        "optim",
        "optim_grads",
        "optim_grads_params",
        "optim_grad_params",
    ],  # the last is misspelt on purpose
    "ddp.average_in_collective": [True, False],
    "ddp.disable_symmetric_registration": [False, True],
    "ddp.use_distributed_optimizer": [True, False],
    "optimizer.use_distributed_optimizer": [True, False],
    "ddp.nccl_ub": [False, True],
    "ddp.fsdp_manual_registration": [False, True],
    "ddp.fsdp_double_buffer": [False, True],
    "ddp.reuse_grad_buf_for_mxfp8_param_ag": [False, True],
    "ddp.num_buckets": [None, 4],
    "optimizer.use_precision_aware_optimizer": [False, True],
    "dist.use_torch_fsdp2": [False, True],
    "dist.use_tp_pp_dp_mapping": [False, True],
    "dist.use_gloo_process_groups": [True, False],
    "checkpoint.ckpt_format": ["torch_dist", "fsdp_dtensor", "torch", "torch_dcp"],
    "checkpoint.save": [None, "/tmp/mfsdp_diff_ckpt"],
    "checkpoint.load": [None, "/tmp/mfsdp_diff_ckpt"],
    "checkpoint.async_save": [False, True],
    "checkpoint.use_persistent_ckpt_worker": [True, False],
    "checkpoint.also_save_hf_checkpoint": [False, True],
    "train.check_weight_hash_across_dp_replicas_interval": [None, 100],
    "model.cpu_offloading": [False, True],
    "model.cpu_offloading_num_layers": [0, 1, 1000],
    "model.recompute_granularity": [None, "full", "selective"],
    "model.fine_grained_activation_offloading": [False, True],
    "model.offload_modules": [None, ["core_attn"]],
    "optimizer.optimizer": ["adam", "sgd"],
    "mixed_precision": ["bf16_mixed", "fp16_mixed", "bf16_with_mxfp8_mixed"],
}
# Environment variables the rules read: name -> candidate values (None = unset). The generator
# should unset every name here that a case does not give, so Bridge sees exactly the case's env.
DIFFERENTIAL_ENV: dict[str, list] = {
    MAX_CONN: [None, "1", "32"],
    "NVTE_CPU_OFFLOAD_V1": [None, "1"],
    "PYTORCH_CUDA_ALLOC_CONF": [None, "expandable_segments:True"],
}
