"""``mfsdp.py memory``: argparse glue around ``mfsdp_lib.memory``.

Kept thin on purpose: the model (and every formula's source) lives in
``memory.py``; this module only turns arguments into a ``memory.report`` call and
prints the result as a table or as the JSON object. A CONFIG and ``KEY=VALUE``
overrides are loaded with ``config_io.load_effective`` (Bridge defaults, then the
YAML, then the overrides), so the estimate sees the same effective config as
``check``. Bad input becomes ``InputError``: one stderr line, exit 2.
"""

from __future__ import annotations

import json
import re
import sys

from .. import memory, what_works
from ..findings import InputError

DESCRIPTION = """\
Estimate per-GPU memory for DDP, the distributed optimizer (distopt) and each Megatron
FSDP sharding strategy (no_shard, optim, optim_grads, optim_grads_params): parameters,
gradients, optimizer state, Megatron FSDP's unsharded buffers, activations and the
total, whether it fits in --gpu-mem-gib, and the smallest data-parallel size at which
each strategy fits. Precision (bf16, grad_reduce_in_fp32, megatron_fsdp_main_*_dtype,
use_precision_aware_optimizer, optimizer_cpu_offload), recomputation and parallel sizes
are read from the config when one is given.

The model to size comes from: --model NAME (built-in: {builtins}), --hf-config PATH
(a Hugging Face config.json: Llama, Mistral, Qwen2/3, Qwen3-MoE, Mixtral, Gemma 2/3, gpt-oss,
DeepSeek V2/V3 and Kimi K2 (MLA, MoE, MTP), Nemotron-H (hybrid Mamba), Qwen3-VL, VLM text models),
--params N (no shape: no activations, no FSDP buffers; with EP > 1 add --expert-params),
or the config's model section (GPT, MLA, MoE, MTP and hybrid providers). A peft section
sizes LoRA: frozen base weights keep no gradients or optimizer state. optimizer.optimizer
muon/dist_muon, FP8 recipes (mixed_precision *fp8*, model.fp8_param) are sized as the code
stores them. A layout that cannot be built (heads or query groups vs TP, experts vs EP,
DP x CP x TP vs EP x ETP, layers vs PP) is refused with the rule, not estimated.

examples:
  mfsdp.py memory --model llama3-8b --dp 8 --gpu-mem-gib h100      # 79.18 GiB: what a process gets
  mfsdp.py memory --model llama3-70b --dp 64 --tp 4 --strategy optim_grads_params --gpu-mem-gib h200
  mfsdp.py memory run_config.yaml --dp 16 --gpu-mem-gib 80 --format json
  mfsdp.py memory run_config.yaml model.recompute_granularity=full model.recompute_method=uniform \\
      model.recompute_num_layers=1 --dp 8 --gpu-mem-gib 80
  mfsdp.py memory --params 13e9 --dp 32 --gpu-mem-gib 80      # model state only
  mfsdp.py memory --hf-config ./Qwen3-30B-A3B/config.json --ep 8 --dp 64 --seq-length 4096 --gpu-mem-gib 141
"""

EPILOG = """\
Reading the table: GiB per GPU on the most-loaded rank. 'buffers' are Megatron FSDP's
(preserved embedding/output copies, all-gather window, reduce-scatter queue); 'total' is
model state + the largest of: activations + buffers alive with them, the late reduce-scatter
queue, the optimizer-step fp32 gradient copy, plus a margin calibrated on measured runs. 'min DP'
is the smallest data-parallel size at which that strategy's fits says yes (-: never, by this model).
'fits': yes = the total is within 90% of --gpu-mem-gib; tight = above that and within the
GPU, where what the total does not count (CUDA context, NCCL, allocator fragmentation) must fit;
NO = above it; n/a(PP>1) = a Megatron FSDP strategy a pipeline-parallel layout cannot run.
--gpu-mem-gib h100 / h200 use the memory a process gets on those cards (measured).
Details and OOM triage: references/memory.md.

Exit codes: 0 estimate printed; 1 --gpu-mem-gib given and no reported strategy fits at
this DP (yes or tight; n/a counts as not fitting); 2 unusable input.
"""

TOO_LARGE = "numbers too large to estimate: check --params, --seq-length, --micro-batch-size and the parallel sizes"
_KV = re.compile(r"^[A-Za-z_][\w.]*=")
_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def configure(parser) -> None:
    parser.description = DESCRIPTION.format(builtins=", ".join(memory.builtin_names()))
    parser.add_argument(
        "inputs",
        nargs="*",
        metavar="CONFIG|KEY=VALUE",
        help="a Bridge run_config.yaml (or partial YAML) and/or section.key=value overrides",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", metavar="NAME", help="built-in shape: " + ", ".join(memory.builtin_names()))
    source.add_argument("--params", metavar="N", help="parameter count, e.g. 8.03e9 or 8.03B")
    source.add_argument(
        "--hf-config", metavar="PATH", help="a Hugging Face config.json (or the folder holding it) to size"
    )
    parser.add_argument(
        "--expert-params", metavar="N", help="with --params: how many of them are routed experts (needed with EP > 1)"
    )
    for flag, what in (
        ("dp", "data-parallel"),
        ("tp", "tensor-parallel"),
        ("pp", "pipeline-parallel"),
        ("cp", "context-parallel"),
        ("ep", "expert-parallel"),
        ("etp", "expert-tensor-parallel"),
    ):
        parser.add_argument(f"--{flag}", type=int, metavar="N", help=f"{what} size (default: the config's, else 1)")
    parser.add_argument(
        "--gpus",
        type=int,
        metavar="N",
        help="world size: DP = N / (TP x PP x CP), refused when it does not divide; checked against --dp when both are given",
    )
    parser.add_argument(
        "--strategy",
        action="append",
        metavar="NAME",
        help="one of " + ", ".join(memory.STRATEGIES) + ", all (default all; repeatable, or comma-separated)",
    )
    parser.add_argument("--seq-length", type=int, metavar="N", help="sequence length (default: config's)")
    parser.add_argument(
        "--micro-batch-size", type=int, metavar="N", help="micro-batch size (default: config's, else 1)"
    )
    parser.add_argument(
        "--gpu-mem-gib",
        metavar="G",
        help="GPU memory to fit in: GiB, or h100 / h200 for what a process gets on that card "
        "(79.18 / 139.80 GiB, measured; the nominal 80 / 141 are more than a process can have)",
    )
    parser.add_argument("--format", choices=("text", "json"), default="text")


def parse_count(text: str, flag: str = "--params") -> float:
    """``8.03e9``, ``8030000000``, ``8.03B``, ``405b``, ``770M`` -> a number of parameters."""
    raw = str(text).strip().replace("_", "").replace(",", "")
    scale = 1.0
    if raw and raw[-1].lower() in _SUFFIX:
        scale, raw = _SUFFIX[raw[-1].lower()], raw[:-1]
    try:
        value = float(raw) * scale
    except ValueError:
        raise InputError(f"{flag} must be a number such as 8.03e9 or 8.03B, got {text!r}") from None
    return value


def _split_inputs(inputs: list[str]) -> tuple[str | None, list[str]]:
    path, overrides = None, []
    if inputs:
        from .. import config_io  # imports yaml lazily; only the word check here

        for item in inputs:  # ~KEY (Hydra's deletion), section.key without =VALUE: say so, not "no such file"
            config_io.refuse_unusable_override(item)
    for item in inputs:
        if _KV.match(item):
            overrides.append(item)
        elif path is None:
            path = item
        else:
            raise InputError(f"more than one CONFIG given ({path!r}, {item!r}); overrides are KEY=VALUE")
    return path, overrides


def load_config(path: str | None, overrides: list[str], own_model: bool = False):
    """The effective config via config_io, or None when neither a file nor overrides were given.

    Overrides without a CONFIG apply to the embedded Llama 3 8B recipe (as in ``check``) only when the
    model sized is that recipe's. When the user names the model (``own_model``: --params, --model,
    --hf-config), the recipe is not the job: its layout (CP 2), sequence length and strategy must not
    slip under the user's model, so the overrides stand alone (``config_io.overrides_alone``) and
    everything else is what the estimate assumes without a config.
    """
    if path is None and not overrides:
        return None
    from .. import config_io  # imports yaml: only when there is a config to read

    if path is None and own_model:
        return config_io.overrides_alone(overrides)
    return config_io.load_effective(path, overrides)


def _given_keys(path: str | None, overrides: list[str]) -> set[str] | None:
    """The dotted keys the user wrote in CONFIG and the overrides (None without a CONFIG: the embedded recipe, or
    the overrides alone, is taken as written). Tells the estimate which keys came from Bridge's defaults."""
    if path is None:
        return None
    from .. import config_io

    data, _ = config_io.load_file_data(path)
    keys = {f"{section}.{k}" for section, v in data.items() if isinstance(v, dict) for k in v}
    keys |= {section for section, v in data.items() if v is not None}
    keys |= {o.split("=", 1)[0].strip() for o in overrides}
    return keys


def _strategies(values: list[str] | None) -> tuple[str, ...]:
    if not values:
        return ("all",)
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    return tuple(names) or ("all",)


def run(args) -> int:
    path, overrides = _split_inputs(args.inputs)
    own_model = any(v is not None for v in (args.params, args.model, args.hf_config))
    cfg = load_config(path, overrides, own_model)
    try:
        result = memory.report(
            cfg,
            params=parse_count(args.params) if args.params is not None else None,
            model=args.model,
            dp=args.dp,
            tp=args.tp,
            pp=args.pp,
            cp=args.cp,
            ep=args.ep,
            strategies=_strategies(args.strategy),
            seq_length=args.seq_length,
            micro_batch_size=args.micro_batch_size,
            gpu_mem_gib=args.gpu_mem_gib,
            hf_config=args.hf_config,
            expert_params=parse_count(args.expert_params, "--expert-params")
            if args.expert_params is not None
            else None,
            etp=args.etp,
            gpus=args.gpus,
            given=_given_keys(path, overrides),
            overrides_only=path is None and own_model and bool(overrides),
        )
    except memory.ModelError as exc:
        raise InputError(str(exc)) from None
    except OverflowError:  # e.g. --seq-length 1e400 as an int: float() of it overflows
        raise InputError(TOO_LARGE) from None
    inherited = {} if own_model else _inherited_parallelism(path, overrides, args)
    if inherited:
        result["inherited_from_embedded_recipe"] = inherited
        result["assumptions"].setdefault("notes", []).append(_inherited_note(inherited))
    try:  # a size so large that a figure became inf/nan: no estimate, and never "Infinity" in the JSON
        text = json.dumps(result, indent=2, allow_nan=False)
    except ValueError:
        raise InputError(TOO_LARGE) from None
    if args.format == "json":
        sys.stdout.write(text + "\n")
    else:
        sys.stdout.write(render_text(result))
    what_works.show(cfg, args.format)
    if result["gpu_mem_gib"] is not None and not any(r["fits"] for r in result["strategies"]):
        return 1
    return 0


# Parallel sizes a job may leave out of its overrides, with the flag that sets each here. Overrides given without a
# CONFIG or a model of the user's apply to the embedded Llama 3 8B recipe (as in `check`), so a size it sets other
# than 1 (its CP=2) becomes the estimated job's unless the user names it: the layout line marks it, and a note says
# how to drop it.
PARALLEL_SIZES = (
    ("tensor_model_parallel_size", "--tp"),
    ("pipeline_model_parallel_size", "--pp"),
    ("context_parallel_size", "--cp"),
    ("expert_model_parallel_size", "--ep"),
)


def _inherited_parallelism(path: str | None, overrides: list[str], args) -> dict[str, int]:
    """Parallel sizes other than 1 that the estimate took from the embedded recipe rather than from the user."""
    if path is not None or not overrides:
        return {}
    from .. import config_io

    model = config_io.embedded_default().get("model") or {}
    named = {o.split("=", 1)[0].strip().rsplit(".", 1)[-1] for o in overrides}
    out = {}
    for key, flag in PARALLEL_SIZES:
        value = model.get(key)
        if isinstance(value, int) and value != 1 and key not in named and getattr(args, flag[2:], None) is None:
            out[key] = value
    return out


def _inherited_note(inherited: dict[str, int]) -> str:
    sizes = ", ".join(f"{k}={v}" for k, v in inherited.items())
    flags = " ".join(f"{f} 1" for k, f in PARALLEL_SIZES if k in inherited)
    return (
        f"no CONFIG given: the overrides apply to the embedded Llama 3 8B recipe, whose {sizes} this estimate uses; "
        f"add {flags} (or the model.* override) for a job without it"
    )


def _value(v) -> str:
    return "true" if v is True else "false" if v is False else "null" if v is None else str(v)


def _below_above(diff: float) -> str:
    return f"{abs(diff):.1%} {'below' if diff < 0 else 'above'}"


def _model_provenance(m: dict) -> list[str]:
    """Lines under the model line: keys that came from Bridge's defaults, and how far the count is from the
    named model's (``model.hf_model_id``) or from the config's own model section (--hf-config / --model)."""
    out = []
    used = dict(m.get("defaults_used") or {})
    bf16 = used.pop("model.bf16", None)
    if used:
        out.append(
            "defaults: the config does not set "
            + ", ".join(f"{k}={_value(v)}" for k, v in used.items())
            + ": these are Bridge's GPTModelProvider defaults; set them if your model differs"
        )
    if bf16 is not None:
        out.append(
            "precision: no model.bf16, model.fp16 or mixed_precision in the config: Bridge's default model.bf16=false "
            "means fp32 weights, 4 bytes per parameter (Bridge's recipes set mixed_precision=bf16_mixed: add it, "
            "or model.bf16=true, if yours does)"
        )
    ref = m.get("reference")
    if ref:
        out.append(
            f"reference: {ref['name']} ({ref['source']} {ref['id']}) has {ref['params'] / 1e9:.3f} B parameters; "
            f"this count is {_below_above(ref['difference'])}"
        )
    own = m.get("config_model_section")
    if own:
        gap = f"{own['params'] / 1e9:.3f} B parameters, {_below_above(own['difference'])} this model's"
        keys = ", ".join(f"{k}={_value(v)}" for k, v in (own.get("defaults_used") or {}).items())
        out.append(
            f"the config's model section counts {gap}"
            + (f" (it leaves these to Bridge's defaults: {keys})" if keys else "")
            + "; this estimate sizes the model named on the command line"
        )
    return out


# The fits cell of a strategy the layout cannot run. One word, as every cell of the table: readers split rows
# on whitespace (the JSON's "fit" says "n/a (PP > 1)").
_PP_CELL = "n/a(PP>1)"


def _fit_cell(row: dict) -> str:
    fit = row.get("fit")
    if fit is None:
        return "-"
    return {"no": "NO", memory.devices.FIT_PP: _PP_CELL}.get(fit, fit)


def _num(x, width: int = 7) -> str:
    return f"{'-':>{width}}" if x is None else f"{x:>{width}.2f}"


def render_text(result: dict) -> str:
    m, par, a = result["model"], result["parallelism"], result["assumptions"]
    lines = [
        f"model: {m['name'] or 'unnamed'} ({m['source']}): {m['params'] / 1e9:.3f} B parameters, "
        f"{m['params_per_gpu'] / 1e9:.3f} B on the most-loaded GPU"
    ]
    inherited = result.get("inherited_from_embedded_recipe") or {}

    def size(name: str, key: str) -> str:  # a size taken from the embedded recipe says so in the layout itself
        return f"{name}={par[name.lower()]}" + (" (embedded recipe's)" if key in inherited else "")

    run_line = " ".join(
        size(n, k)
        for n, k in (
            ("DP", ""),
            ("TP", "tensor_model_parallel_size"),
            ("PP", "pipeline_model_parallel_size"),
            ("CP", "context_parallel_size"),
            ("EP", "expert_model_parallel_size"),
        )
    )
    if par.get("etp", par["tp"]) != par["tp"]:
        run_line += f" ETP={par['etp']}"
    if "seq_length" in a:
        run_line += f", seq {a['seq_length']}, micro-batch {a['micro_batch_size']}, recompute {a['recompute']}"
    gpu = result.get("gpu")
    if gpu:
        run_line += (
            f", GPU {gpu['gib']:.2f} GiB ({gpu['preset'].upper()})" if gpu["preset"] else f", GPU {gpu['gib']:g} GiB"
        )
    lines.append(run_line)
    if result.get("inherited_from_embedded_recipe"):
        lines.append("note: " + _inherited_note(result["inherited_from_embedded_recipe"]))
    lines += _model_provenance(m)
    lines.append("")
    cells = {r["name"]: _fit_cell(r) for r in result["strategies"]}
    width = max(6, *(len(c) + 1 for c in cells.values()))
    header = (
        f"{'strategy':<20}{'params':>8}{'grads':>8}{'optim':>8}{'buffers':>8}{'activ.':>8}"
        f"{'total':>8}{'fits':>{width}}{'min DP':>8}"
    )
    lines.append(header)
    for r in result["strategies"]:
        fits = cells[r["name"]]
        min_dp = r["smallest_dp_that_fits"]
        min_dp = "-" if min_dp is None else str(min_dp)
        mark = "*" if r["configured"] else " "
        lines.append(
            f"{r['name'] + mark:<20}{_num(r['params_gib'], 8)}{_num(r['grads_gib'], 8)}"
            f"{_num(r['optimizer_gib'], 8)}{_num(r['buffers_gib'], 8)}{_num(r['activations_gib'], 8)}"
            f"{_num(r['total_gib'], 8)}{fits:>{width}}{min_dp:>8}"
        )
    lines.append(
        "GiB per GPU"
        + ("; * = the strategy this config selects" if any(r["configured"] for r in result["strategies"]) else "")
    )
    if gpu:
        lines.append(
            f"fits: yes = total <= {gpu['tight_above_gib']:.2f} GiB ({gpu['tight_fraction']:.0%} of the GPU); "
            f"tight = above that, leaving too little for what the total does not count: {gpu['not_counted']}; "
            "NO = above the GPU. min DP: the smallest data-parallel size that gives yes"
        )
        if any(r["fit"] == memory.devices.FIT_PP for r in result["strategies"]):
            lines.append(
                f"{_PP_CELL}: Megatron FSDP cannot run with pipeline parallelism (check: MFSDP-PIPELINE-PARALLEL); "
                "'mfsdp.py enable CONFIG --set-pp-1' sets PP=1, then size that layout with --pp 1"
            )
        if gpu.get("note"):
            lines.append("note: " + gpu["note"])
        if gpu["preset"]:
            lines.append(f"GPU: {gpu['gib']:.2f} GiB is what a process gets on an {gpu['card']} ({gpu['source']})")
    calib = [f"{r['name']} {r['calibration_gib']:.2f}" for r in result["strategies"] if r.get("calibration_gib")]
    if calib:
        lines.append("total includes a margin calibrated on measured runs (GiB): " + ", ".join(calib))
    configured = [r for r in result["strategies"] if r["configured"]] or result["strategies"][:1]
    for r in configured:
        lines += ["", f"modelled ({r['name']}):"] + [f"  - {t}" for t in r["modelled"]]
        lines += [f"assumed ({r['name']}):"] + [f"  - {t}" for t in r["assumed"]]
    notes = [(r["name"], n) for r in result["strategies"] for n in r["notes"]]
    recipe = result.get("inherited_from_embedded_recipe")
    shown = _inherited_note(recipe) if recipe else None  # already under the layout
    general = [n for n in a.get("notes", []) if n != shown]
    if notes or general:
        lines += ["", "notes:"]
        lines += [f"  {name}: {n}" for name, n in notes]
        lines += [f"  {n}" for n in general]
    lines += ["", "assumptions:"]
    for key in (
        "params_dtype",
        "ddp_distopt_grad_dtype",
        "fsdp_grad_dtype",
        "fsdp_main_params_dtype",
        "optimizer",
        "fp8",
        "peft",
        "optimizer_cpu_offload_fraction",
        "sharding_degree",
        "activation_formula",
        "model_state",
        "total",
        "not_counted",
    ):
        if key in a:
            lines.append(f"  {key}: {a[key]}")
    return "\n".join(lines) + "\n"
