"""What the rules read: the effective config view (``Eff``) and small value helpers.

``Eff`` applies what Bridge does before ``validate()`` (the config's ``env_vars`` with
``setdefault``, the mixed-precision copy onto ddp/optimizer/model), so each rule's
predicate reads the value Bridge will judge. The helpers format values the way the user
wrote them (YAML spelling) and name the source files the rules cite.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from .. import schema as S

# GPU architectures whose tuned Bridge recipes ask for CUDA_DEVICE_MAX_CONNECTIONS=1 with
# communication overlap (Bridge's H100 perf recipes: "CUDA stream scheduling for this model and
# parallel layout"); its B200/GB200 recipes use 32. Megatron FSDP forbids 1, hence the advice rule.
PRE_BLACKWELL_ARCHS = ("volta", "ampere", "ada", "hopper")
KNOWN_ARCHS = PRE_BLACKWELL_ARCHS + ("blackwell",)
# Product names people actually type, mapped to their architecture.
ARCH_ALIASES = {
    "v100": "volta",
    "a100": "ampere",
    "a10": "ampere",
    "a30": "ampere",
    "a40": "ampere",
    "l4": "ada",
    "l40": "ada",
    "l40s": "ada",
    "h100": "hopper",
    "h200": "hopper",
    "h800": "hopper",
    "h20": "hopper",
    "gh200": "hopper",
    "b200": "blackwell",
    "b300": "blackwell",
    "gb200": "blackwell",
    "gb300": "blackwell",
}


def normalize_arch(name: str | None) -> str | None:
    """'H100' -> 'hopper'; an architecture name passes through; None for unknown or empty."""
    if not name:
        return None
    key = str(name).strip().lower()
    key = ARCH_ALIASES.get(key, key)
    m = re.match(r"^(?:sm_?)?(\d{2,3})$|^(\d+)\.(\d)$", key)  # sm_90, sm90, 90, 9.0: compute capability
    if m:
        cc = int(m.group(1)) if m.group(1) else int(m.group(2)) * 10 + int(m.group(3))
        key = next((arch for low, arch in _CC_ARCHS if cc >= low), "")
    return key if key in KNOWN_ARCHS else None


# (lowest compute capability x10, architecture), newest first: torch.cuda.get_device_capability().
_CC_ARCHS = ((100, "blackwell"), (90, "hopper"), (89, "ada"), (80, "ampere"), (70, "volta"))

# Checkpoint formats that survive without Gloo process groups / with async save.
DIST_CKPT_FORMATS = ("torch_dist", "fsdp_dtensor")

MAX_CONN = "CUDA_DEVICE_MAX_CONNECTIONS"


class Eff:
    """Effective values the rules read, after what Bridge does before ``validate()``.

    * ``env``: the given environment with the config's ``env_vars`` applied with
      ``setdefault`` (Bridge's ``apply_environment_variables``: the process wins).
    * mixed precision: when ``mixed_precision`` is a preset name or a mapping, its
      fields overwrite same-named fields of ``ddp``/``optimizer``/``model``
      (``MixedPrecisionConfig.setup`` -> ``update_config_with_precision_overrides``),
      and ``origin(path)`` reports the ``mixed_precision.*`` key as the one to change.
    * ``world``: the job's world size (number of GPUs) when the caller knows it, with ``world_how``
      saying where it came from; unknown (None), the rules that need it use the smallest world the
      layout allows (``world_size``), where a divisibility failure is certain: it repeats at every
      multiple, and every world the layout runs on is one.
    """

    __slots__ = ("cfg", "env", "env_from_config", "gpu_arch", "mp", "_mp_paths", "world", "world_how")

    def __init__(
        self,
        cfg: Mapping,
        env: Mapping[str, str],
        gpu_arch: str | None,
        world: int | None = None,
        world_how: str | None = None,
    ):
        self.cfg = cfg
        self.world = world
        self.world_how = world_how
        self.gpu_arch = normalize_arch(gpu_arch)
        merged = dict(env)
        self.env_from_config = set()  # names whose value came from the config's env_vars
        env_vars = cfg.get("env_vars")
        if isinstance(env_vars, Mapping):
            for name, value in env_vars.items():
                if str(name) not in merged:
                    merged[str(name)] = _env_str(value)
                    self.env_from_config.add(str(name))
        self.env = merged
        self.mp = resolve_mixed_precision(cfg.get("mixed_precision"))
        self._mp_paths = {}
        if self.mp is not None:
            for sec, keys in S.MP_TARGETS.items():
                for k in keys:
                    self._mp_paths[f"{sec}.{k}"] = f"mixed_precision.{k}"

    def get(self, path: str):
        mp_path = self._mp_paths.get(path)
        if mp_path is not None and self.mp is not None:
            return self.mp.get(mp_path.split(".", 1)[1])
        return raw_get(self.cfg, path)

    def origin(self, path: str) -> str:
        """The key the user must edit to change ``path`` (mixed precision wins over ddp.*)."""
        return self._mp_paths.get(path, path)

    @property
    def fsdp(self) -> bool:
        """Megatron FSDP is on when either flag is (Bridge then sets both)."""
        return bool(self.get("dist.use_megatron_fsdp")) or bool(self.get("ddp.use_megatron_fsdp"))

    @property
    def ckpt_io(self) -> bool:
        """Bridge's guard 'only check if saving or loading'."""
        return self.get("checkpoint.save") is not None or self.get("checkpoint.load") is not None

    @property
    def world_size(self) -> tuple[int, str]:
        """(world size the batch rules judge at, how it was found)."""
        if self.world is not None:
            return self.world, self.world_how or "the job's world size"
        return min_world(self), MIN_WORLD_HOW

    @property
    def dist_opt(self) -> bool:
        """Distributed optimizer after Bridge's sync (either flag, or forced by Megatron FSDP)."""
        return (
            self.fsdp
            or bool(self.get("ddp.use_distributed_optimizer"))
            or bool(self.get("optimizer.use_distributed_optimizer"))
        )


def _env_str(value) -> str:
    # Bridge does os.environ.setdefault(name, str(value)): Python's str(), so True -> "True".
    return str(value)


def raw_get(cfg: Mapping, path: str):
    """Value at a dotted path, falling back to the schema default when absent.

    A model given as Megatron's ``GPTModelConfig`` / ``HybridModelConfig`` keeps its transformer
    settings one level down (``model.transformer.*``, proxied by ``__getattr__``): a ``model.X``
    that the nested transformer holds is read there (the top level then only has our defaults).
    """
    if path.startswith("model."):
        model = cfg.get("model")
        key = path.split(".", 1)[1]
        if isinstance(model, Mapping) and isinstance(model.get("transformer"), Mapping) and key in model["transformer"]:
            return model["transformer"][key]
    node = cfg
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            d = S.default(path)
            return None if d == S.FACTORY else d  # computed at construction: unknown here
        node = node[part]
    return node


def resolve_mixed_precision(mp) -> dict | None:
    """The preset's fields (name given) or the mapping's fields over the class defaults."""
    if mp is None:
        return None
    if isinstance(mp, str):
        preset = S.MIXED_PRECISION_PRESETS.get(mp)
        return dict(preset) if preset is not None else None
    if isinstance(mp, Mapping):
        out = dict(S._MP_BASE)
        out.update({k: v for k, v in mp.items() if k in out})
        return out
    return None


def kv(e: Eff, path: str) -> str:
    """``path=value`` as the user wrote it (YAML spelling for None/bools)."""
    return f"{e.origin(path)}={fmt(e.get(path))}"


def fmt(value) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)


def envfmt(e: Eff, name: str) -> str:
    if name not in e.env:
        return f"{name} unset"
    where = "the config's env_vars" if name in e.env_from_config else "the environment"
    return f"{name}={e.env[name]!r} (from {where})"


# Prefix of a source that is in the Megatron-Bridge repository but not in the wheel (the
# performance harness under scripts/): cited as found there, not checked offline.
GITHUB_ONLY = "Megatron-Bridge repository, not in the wheel:"

# Source anchors reused by several rules.
SRC_FSDP_CFG = f"{S.B_CFG}: ConfigContainer._validate_and_apply_megatron_fsdp_configs"
SRC_VALIDATE = f"{S.B_CFG}: ConfigContainer.validate"
SRC_MFSDP_BUF = "megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py"


# Enum-typed paths the MFSDP-ENUM rule checks (every schema field with choices).
ENUM_PATHS = tuple(p for p, rec in S.FIELDS.items() if rec[2] is not None)


def bad_enums(e: Eff) -> list:
    out = []
    for p in ENUM_PATHS:
        sec = p.split(".", 1)[0]
        if sec == "mixed_precision" and not isinstance(e.cfg.get("mixed_precision"), Mapping):
            continue
        v = raw_get(e.cfg, p)
        rec = S.FIELDS[p]
        if v is None and rec[3]:
            continue
        if v not in rec[2]:
            out.append((p, v, rec[2]))
    return out


def closest(value, choices) -> str:
    import difflib

    close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.0)
    return close[0] if close else choices[0]


def as_int(v, fallback: int) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else fallback


def int_gt(v, n: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > n


def bad_offload_layers(e: Eff) -> bool:
    n, k = e.get("model.cpu_offloading_num_layers"), e.get("model.num_layers")
    if not isinstance(n, int) or not isinstance(k, int):
        return False
    return n < 0 or n >= k


def comm_overlap_on(e: Eff, key: str) -> bool:
    co = e.cfg.get("comm_overlap")
    return isinstance(co, Mapping) and bool(co.get(key))


def moe_ep_overlap(e: Eff) -> bool:
    """Effective ``overlap_moe_expert_parallel_comm`` on the model after Bridge's comm-overlap setup.

    With a ``comm_overlap`` section, ``CommOverlapConfig.setup`` starts from False and copies the
    user's non-null value onto the model (``_get_model_comm_overlap_cfgs`` /
    ``_override_user_cfgs``); without one, the model's own field stands.
    """
    co = e.cfg.get("comm_overlap")
    if isinstance(co, Mapping):
        return co.get("overlap_moe_expert_parallel_comm") is True
    return bool(e.get("model.overlap_moe_expert_parallel_comm"))


def pp_size(e: Eff) -> int:
    return as_int(e.get("model.pipeline_model_parallel_size"), 1)


# --------------------------------------------------------------------------- world size, data parallelism, batches

MIN_WORLD_HOW = "the smallest world this layout allows, so at every world it can run on"


def layout(e: Eff) -> dict[str, int]:
    """TP, PP, CP, EP and ETP (None: TP, as megatron-core's initialize_model_parallel does), each at least 1."""
    lay = {
        k: max(1, as_int(e.get(f"model.{f}"), 1))
        for k, f in (
            ("tp", "tensor_model_parallel_size"),
            ("pp", "pipeline_model_parallel_size"),
            ("cp", "context_parallel_size"),
            ("ep", "expert_model_parallel_size"),
        )
    }
    etp = e.get("model.expert_tensor_parallel_size")
    lay["etp"] = max(1, etp) if isinstance(etp, int) and not isinstance(etp, bool) else lay["tp"]
    return lay


def min_world(e: Eff) -> int:
    """The smallest world size megatron-core accepts for the layout: TP x PP x CP (Bridge's
    get_data_parallel_size) and ETP x EP x PP (parallel_state.initialize_model_parallel) both divide it."""
    lay = layout(e)
    return math.lcm(lay["tp"] * lay["pp"] * lay["cp"], lay["etp"] * lay["ep"] * lay["pp"])


def _pos_int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _dist_train(e: Eff) -> bool:
    """VLM recipes that train the language model on its own world (Bridge then uses language_world_size)."""
    dt = e.get("model.dist_train")
    return isinstance(dt, Mapping) and dt.get("use_dist_train") is True


def world_problem(e: Eff) -> dict | None:
    """The given world size does not fit the layout (only when the world is given: the smallest always fits)."""
    if e.world is None or _dist_train(e):
        return None
    lay = layout(e)
    dense = lay["tp"] * lay["pp"] * lay["cp"]
    expert = lay["etp"] * lay["ep"] * lay["pp"]
    bad = [(what, n) for what, n in (("TP x PP x CP", dense), ("ETP x EP x PP", expert)) if e.world % n]
    if not bad:
        return None
    return {"world": e.world, "how": e.world_how or "the job's world size", "bad": bad, "lay": lay}


def data_parallel(e: Eff) -> tuple[int, int, str] | None:
    """(world, DP, how) the way Bridge computes DP: world // (TP x PP x CP); None when it does not divide."""
    if _dist_train(e):
        return None
    world, how = e.world_size
    lay = layout(e)
    model = lay["tp"] * lay["pp"] * lay["cp"]
    if world % model:
        return None
    return world, world // model, how


def _multiples(n: int, step: int) -> tuple[int, int]:
    """(largest multiple of step <= n, or 0; smallest multiple of step >= n)."""
    down = (n // step) * step
    return down, down if down == n else down + step


def nearest_multiple(n: int, step: int) -> int:
    """The multiple of ``step`` nearest to ``n`` (ties and 0 go up): the smallest change of a batch size."""
    down, up = _multiples(n, step)
    return up if down == 0 or up - n <= n - down else down


def train_batch_problem(e: Eff) -> dict | None:
    """train.global_batch_size against micro_batch_size x DP, as megatron-core's constant micro-batch calculator
    checks it when training starts (Bridge's initialize passes no step schedule; rampup is ignored)."""
    dp = data_parallel(e)
    gbs, mbs = _pos_int(e.get("train.global_batch_size")), _pos_int(e.get("train.micro_batch_size"))
    if dp is None or gbs is None or mbs is None:
        return None
    world, dp_size, how = dp
    step = mbs * dp_size
    decrease = e.get("train.decrease_batch_size_if_needed") is True
    if (gbs < step) if decrease else (gbs % step):
        down, up = _multiples(gbs, step)
        micro = next((m for m in range(mbs - 1, 0, -1) if gbs % (m * dp_size) == 0), None)
        return {
            "world": world,
            "how": how,
            "dp": dp_size,
            "gbs": gbs,
            "mbs": mbs,
            "step": step,
            "down": down,
            "up": up,
            "micro": micro,
            "decrease": decrease,
            "lay": layout(e),
        }
    return None


def eval_batch_problem(e: Eff) -> dict | None:
    """validation.eval_global_batch_size against eval_micro_batch_size x eval DP, as Bridge's validate() checks it
    (both default to the training values; dist.eval_context_parallel_size changes the eval DP)."""
    dp = data_parallel(e)
    egbs = e.get("validation.eval_global_batch_size")
    embs = e.get("validation.eval_micro_batch_size")
    follows = egbs is None
    egbs = _pos_int(e.get("train.global_batch_size") if egbs is None else egbs)
    embs = _pos_int(e.get("train.micro_batch_size") if embs is None else embs)
    if dp is None or egbs is None or embs is None:
        return None
    world, dp_size, how = dp
    ecp = _pos_int(e.get("dist.eval_context_parallel_size"))
    if ecp is not None:
        lay = layout(e)
        model = lay["tp"] * lay["pp"] * ecp
        if world % model:
            return None  # Bridge asserts the eval layout first; with a guessed world that is not certain
        dp_size = world // model
    step = embs * dp_size
    if egbs % step == 0:
        return None
    return {
        "world": world, "how": how, "dp": dp_size, "egbs": egbs, "embs": embs, "step": step,
        "nearest": nearest_multiple(egbs, step), "follows_train": follows, "lay": layout(e),
    }  # fmt: skip


# Source files the MoE / CUDA-graph / PEFT rules cite (site-packages relative).
SRC_MCORE_FSDP = "megatron/core/distributed/fsdp/mcore_fsdp_adapter.py"
SRC_MLM_ARGS = "megatron/training/arguments.py"  # Megatron-LM's own launcher checks (shipped in megatron-core)
SRC_MLM_TRAINING = "megatron/training/training.py"
SRC_B_CKPT = "megatron/bridge/training/checkpointing.py"
SRC_B_PROVIDER = "megatron/bridge/models/model_provider.py"
