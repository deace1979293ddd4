#!/usr/bin/env python3
"""Generate Bridge's own verdicts on many config variations, for the differential test of our rules.

Our ``check`` rules claim to predict what Megatron-Bridge will reject. The only
honest test of that claim is Bridge itself: this script, run where Bridge imports
(a CUDA machine with Transformer Engine), builds a base ``ConfigContainer`` - the
smoke test's small Llama on mock data, plain DDP, checkpoint saving on - writes its
real ``to_yaml()`` as ``base_run_config.yaml``, then for each generated case applies
``section.key=value`` overrides (and process environment) to a fresh copy and runs
the real ``runtime_config_update(cfg)`` (environment defaults, mixed precision,
data-parallel size, ``ConfigContainer.validate()``), recording whether it raised.
``tests/rules/test_differential.py`` replays the same cases through our
rules offline and compares.

Each case gets a freshly built base (``runtime_config_update`` mutates the container)
and the process environment is restored after it (Bridge applies the config's
``env_vars`` to ``os.environ`` with ``setdefault``, so one case would leak into the
next). No case turns on deterministic mode, the one global torch switch validate() sets.

World size: no process group is created; ``WORLD_SIZE=1``/``RANK=0`` are set, which
Megatron-Core's ``safe_get_world_size`` reads. Cases keep tensor/pipeline/context
parallel sizes at 1, so every case is consistent with one rank and verdicts never
depend on the machine's GPU count.

    python3 tests/differential/gen_verdicts.py --out tests/fixtures/differential   # on the GPU machine
    python3 tests/differential/gen_verdicts.py --list-cases                        # anywhere: the cases only
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

SEED = 20261202  # fixed: the case list is the same on every run, so verdict files diff cleanly
WORLD = {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}
BASE_SAVE_DIR = "/tmp/mfsdp-differential/checkpoints"  # never written: no training runs here

# The five settings that turn Megatron FSDP on in Bridge 0.6.2 (what validate() forces or asserts).
FSDP_ON = [
    "dist.use_megatron_fsdp=true",
    "ddp.use_megatron_fsdp=true",
    "ddp.use_distributed_optimizer=true",
    "optimizer.use_distributed_optimizer=true",
    "checkpoint.ckpt_format=fsdp_dtensor",
]

# Fields and environment variables the rules read, with values worth trying (invalid ones
# included): ``rules.DIFFERENTIAL_FIELDS`` / ``DIFFERENTIAL_ENV``, so the cases
# exercise exactly what our rules claim to know. Values are turned into the YAML spelling a
# ``section.key=value`` override uses.
from mfsdp_lib.rules.differential import DIFFERENTIAL_ENV, DIFFERENTIAL_FIELDS  # noqa: E402


def _spell(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


FIELD_VALUES = {k: [_spell(v) for v in vals] for k, vals in DIFFERENTIAL_FIELDS.items()}
ENV_VALUES = [{}] + [{name: v} for name, vals in DIFFERENTIAL_ENV.items() for v in vals if v is not None]
ENV_NAMES = tuple(DIFFERENTIAL_ENV)
MAX_CONN = "CUDA_DEVICE_MAX_CONNECTIONS"


def generate_cases() -> list[dict]:
    """Deterministic cases: targeted ones first (each rule's trigger and its neighbours), then random mixes."""
    cases: list[tuple[list[str], dict]] = [([], {}), (list(FSDP_ON), {})]
    # leave one of the five out
    for i in range(len(FSDP_ON)):
        cases.append((FSDP_ON[:i] + FSDP_ON[i + 1 :], {}))
    # each single field value on top of plain DDP and on top of FSDP
    for field, values in FIELD_VALUES.items():
        for v in values:
            cases.append(([f"{field}={v}"], {}))
            cases.append((FSDP_ON + [f"{field}={v}"], {}))
    # the environment, directly and through the config's env_vars (Bridge applies those with setdefault)
    for env in ENV_VALUES[1:]:
        cases.append((list(FSDP_ON), env))
        cases.append(([], env))
    for v in ("1", "8"):
        cases.append((FSDP_ON + [f"env_vars.{MAX_CONN}={v}"], {}))
        cases.append((FSDP_ON + [f"env_vars.{MAX_CONN}={v}"], {MAX_CONN: "4"}))
    # save/load off: the format assertion only applies when saving or loading
    for fmt in ("torch_dist", "torch"):
        cases.append((FSDP_ON + [f"checkpoint.ckpt_format={fmt}", "checkpoint.save=null"], {}))
    # pairs that interact in validate()
    cases += [
        (FSDP_ON + ["ddp.nccl_ub=true", "ddp.fsdp_manual_registration=false"], {}),
        (FSDP_ON + ["ddp.nccl_ub=false", "ddp.fsdp_manual_registration=true"], {}),
        (
            FSDP_ON
            + ["ddp.data_parallel_sharding_strategy=optim", "train.check_weight_hash_across_dp_replicas_interval=100"],
            {},
        ),
        (FSDP_ON + ["ddp.average_in_collective=true", "ddp.disable_symmetric_registration=true"], {}),
        (
            [
                "ddp.use_distributed_optimizer=true",
                "dist.use_gloo_process_groups=false",
                "checkpoint.ckpt_format=torch",
            ],
            {},
        ),
        (["checkpoint.async_save=true", "checkpoint.ckpt_format=torch"], {}),
        (FSDP_ON + ["dist.use_torch_fsdp2=true", "checkpoint.save=null"], {}),
    ]
    rng = random.Random(SEED)
    fields = list(FIELD_VALUES)
    while len(cases) < 220:
        picked = rng.sample(fields, rng.randint(2, 6))
        over = [f"{f}={rng.choice(FIELD_VALUES[f])}" for f in picked]
        if rng.random() < 0.5:  # on top of the five FSDP settings, minus those the mix sets itself
            over = [o for o in FSDP_ON if o.split("=")[0] not in picked] + over
        cases.append((over, rng.choice(ENV_VALUES)))
    # Appended after the random mix so the earlier cases keep their ids: the weight-hash check
    # against each sharding strategy (validate() asserts it off only for optim_grads_params).
    for strategy in ("optim_grads_params", "optim_grads"):
        cases.append(
            (
                FSDP_ON
                + [
                    f"ddp.data_parallel_sharding_strategy={strategy}",
                    "train.check_weight_hash_across_dp_replicas_interval=100",
                ],
                {},
            )
        )
    seen, out = set(), []
    for over, env in cases:
        key = (tuple(over), tuple(sorted(env.items())))
        if key in seen:
            continue
        seen.add(key)
        out.append({"id": f"case-{len(out):03d}", "overrides": over, "env": dict(env)})
    return out


# --------------------------------------------------------------------------- Bridge side


def _parse_value(text: str):
    import yaml

    return yaml.safe_load(text) if text != "" else ""


def apply_override(cfg, override: str) -> None:
    """``section.key=value`` onto the container; a dict (env_vars) gets the key set."""
    path, _, raw = override.partition("=")
    *parents, leaf = path.split(".")
    obj = cfg
    for name in parents:
        obj = obj[name] if isinstance(obj, dict) else getattr(obj, name)
    value = _parse_value(raw)
    if isinstance(obj, dict):
        obj[leaf] = value
    else:
        if not hasattr(obj, leaf):
            raise AttributeError(f"{type(obj).__name__} has no field {leaf!r} (override {override!r})")
        setattr(obj, leaf, value)


def base_container():
    from mfsdp_gpu import smoke
    from mfsdp_gpu.args import smoke_parser

    args = smoke_parser().parse_args(
        [
            "--strategy",
            "ddp",
            "--model",
            "small",
            "--iters",
            "10",
            "--seq-length",
            "512",
            "--out",
            "/tmp/mfsdp-differential",
        ]
    )
    cfg, _ = smoke.build_config(args, save_dir=BASE_SAVE_DIR)
    return cfg


def _bridge_verdict(cfg, case: dict) -> dict:
    from megatron.bridge.training.config import runtime_config_update

    for name in ENV_NAMES:  # Bridge must see exactly the case's environment for these
        os.environ.pop(name, None)
    os.environ.update(WORLD)
    os.environ.update(case["env"])
    try:
        for o in case["overrides"]:
            apply_override(cfg, o)
    except Exception as exc:
        return {"ok": False, "error_type": "OverrideError", "error": f"{type(exc).__name__}: {exc}"[:600]}
    try:
        runtime_config_update(cfg)
        return {"ok": True, "error_type": None, "error": None}
    except Exception as exc:
        return {"ok": False, "error_type": type(exc).__name__, "error": (str(exc) or repr(exc))[:600]}


def run_case(case: dict) -> dict:
    """One case on a freshly built base, with the process environment restored afterwards."""
    saved = dict(os.environ)
    try:
        return _bridge_verdict(base_container(), case)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "differential"))
    p.add_argument("--list-cases", action="store_true", help="print the generated cases as JSON and exit")
    a = p.parse_args(argv)
    cases = generate_cases()
    if a.list_cases:
        json.dump(cases, sys.stdout, indent=1)
        return 0
    os.environ.update(WORLD)
    from importlib import metadata

    cfg = base_container()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg.to_yaml(str(out / "base_run_config.yaml"))
    for case in cases:
        case["bridge"] = run_case(case)
    doc = {
        "generated_by": (
            "tests/differential/gen_verdicts.py on " + _machine() + ": real megatron-bridge "
            f"{metadata.version('megatron-bridge')} runtime_config_update() per case on a freshly built base; "
            "no process group, WORLD_SIZE=1 RANK=0 (so data-parallel size 1); TP=PP=CP=1 in every case; "
            "the variables of rules.DIFFERENTIAL_ENV are removed from the environment before each case's env is applied"
        ),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "bridge_version": metadata.version("megatron-bridge"),
        "base_config": "base_run_config.yaml",
        "cases": cases,
    }
    tmp = out / "verdicts.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out / "verdicts.json")
    bad = sum(not c["bridge"]["ok"] for c in cases)
    print(f"[verdicts] {len(cases)} cases, {bad} rejected by Bridge -> {out / 'verdicts.json'}")
    return 0


def _machine() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.device_count()}x {torch.cuda.get_device_name()}"
    except ImportError:
        pass
    return "a CPU machine"


if __name__ == "__main__":
    sys.exit(main())
