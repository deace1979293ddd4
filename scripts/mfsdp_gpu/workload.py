"""Which training step and mock data a rehearsal drives: Bridge's GPT step, or Wan's flow-matching step.

Bridge's ``train()`` takes the forward step as an argument; the model provider does not carry it.
Bridge's own scripts choose it outside the config: its Wan training example builds a
``WanForwardStep`` and calls ``pretrain(config=cfg, forward_step_func=wan_forward_step)``
(``examples/diffusion/recipes/wan/pretrain_wan.py`` in the Megatron-Bridge repository; not in the
wheel), and its performance runner passes ``WanForwardStep(mode=task)`` for diffusion jobs and
``gpt_step.forward_step`` otherwise. A rehearsal has no such outside knowledge, so it decides from the model provider's class, the one field
that says what the model is: a ``WanModelProvider`` builds a ``WanModel``, whose ``forward(x, grid_sizes,
t, context, ...)`` the GPT step cannot feed (it passes ``input_ids``/``position_ids``).

For Wan (Megatron-Bridge 0.6.2, ``megatron/bridge/diffusion``):

* the step is ``models/wan/wan_step.py`` :: ``WanForwardStep`` (``wan_data_step`` moves the packed batch
  to the GPU and builds the self- and cross-attention ``PackedSeqParams``; the flow-matching pipeline
  noises the latents, runs the model and returns the loss with ``masked_next_token_loss``). Its
  ``mode`` only picks the timestep sampling (``_WAN_MODE_DEFAULTS``: ``pretrain`` logit-normal,
  ``finetune`` uniform): no shape, no buffer and no memory depends on it, so the rehearsal uses
  ``pretrain``, the class's default.
* the data is ``data/wan/wan_mock_datamodule.py`` :: ``WanMockDataModuleConfig``, the same config
  Bridge's ``WanDatasetConfig.build_datasets`` builds when ``dataset.path`` is unset
  (``data/wan/wan_energon_datamodule.py``): its latent and text-context shapes are copied from the
  recipe's dataset when it has them (``WAN_MOCK_SHAPE_FIELDS``), else the class's defaults stand.
  Its collate function ignores the sampled items and returns one packed batch per micro-batch
  (``_collate_ignore_samples`` -> ``mock_batch``): ``number_packed_samples`` samples of
  ``F/patch_temporal x H/patch_spatial x W/patch_spatial`` latent tokens each, whatever the
  micro-batch size. ``model.seq_length`` plays no part (``wan_provider.py``: "unused for
  images/videos").

Every other provider (GPT, hybrid, vision-language) keeps the GPT step and the GPT mock data, as before; a
vision-language one is listed as a deviation (``text_only_vision_deviation``): its vision tower gets no image.

torch and megatron are imported inside the functions.
"""

from __future__ import annotations

from typing import NamedTuple

# The provider class, as Bridge 0.6.2 names it (``_target_`` of a Wan recipe's ``model``); a subclass counts.
WAN_PROVIDER = "megatron.bridge.diffusion.models.wan.wan_provider.WanModelProvider"
WAN_STEP = "megatron.bridge.diffusion.models.wan.wan_step.WanForwardStep"
WAN_MOCK_DATA = "megatron.bridge.diffusion.data.wan.wan_mock_datamodule.WanMockDataModuleConfig"
GPT_STEP = "megatron.bridge.training.gpt_step.forward_step"
# WanForwardStep's default mode; the modes differ only in how timesteps are drawn (see the docstring).
WAN_STEP_MODE = "pretrain"
# WanMockDataModuleConfig's fields that size a batch, copied from the recipe's dataset when present.
WAN_MOCK_SHAPE_FIELDS = (
    "F_latents",
    "H_latents",
    "W_latents",
    "patch_spatial",
    "patch_temporal",
    "number_packed_samples",
    "context_seq_len",
    "context_embeddings_dim",
)
# Its required fields that a recipe's WanDatasetConfig also carries (seq_length is only recorded by Bridge).
WAN_MOCK_RUN_FIELDS = ("seq_length", "packing_buffer_size")
# WanMockDataModuleConfig's own defaults (wan_mock_datamodule.py), for a recipe whose dataset lacks a field.
WAN_MOCK_DEFAULTS = {
    "F_latents": 24,
    "H_latents": 104,
    "W_latents": 60,
    "patch_spatial": 2,
    "patch_temporal": 1,
    "number_packed_samples": 1,
    "context_seq_len": 512,
    "context_embeddings_dim": 4096,
}
# WanDatasetConfig's default packing buffer (wan_energon_datamodule.py); the mock data never reads it.
WAN_PACKING_BUFFER_DEFAULT = 200
# Mock batches are made on the CPU by the collate function: worker processes change no GPU memory and would
# only add processes (and their own random streams) to a rehearsal, so the batches are made in the main process.
WAN_MOCK_WORKERS = 0


class Choice(NamedTuple):
    """What a rehearsal drives: ``kind`` ("gpt" or "wan"), the forward step's dotted name, why."""

    kind: str
    step: str
    why: str


def class_names(obj) -> list[str]:
    """Dotted names (``module.QualName``) of ``obj``'s class and its bases, most derived first."""
    return [f"{c.__module__}.{c.__qualname__}" for c in type(obj).__mro__]


def choose(model) -> Choice:
    """The forward step (and with it the mock data) for a model provider.

    Matched on the provider's class and its bases by full dotted name (``WAN_PROVIDER``), never on part
    of a name: a ``WanModelProvider`` or a subclass of it is Wan; anything else, including a missing
    model, keeps Bridge's GPT step (``megatron/bridge/training/gpt_step.py`` :: ``forward_step``), as
    Bridge's own performance runner does for every job that is not diffusion."""
    if model is not None and WAN_PROVIDER in class_names(model):
        return Choice(
            "wan",
            WAN_STEP,
            f"the model provider is {WAN_PROVIDER}: WanModel.forward(x, grid_sizes, t, context) is fed by "
            "WanForwardStep's flow-matching pipeline (megatron/bridge/diffusion/models/wan/wan_step.py)",
        )
    return Choice("gpt", GPT_STEP, "Bridge's GPT step on mock GPT data")


# The field a model provider with a vision tower carries its config in (Bridge 0.6.2's Qwen-VL, Qwen3.5-VL, Gemma-VL,
# GLM-V, Kimi-VL, Ernie-VL and Nemotron-Omni providers); read by name, on the provider, never by a class-name match.
VISION_FIELD = "vision_config"


def text_only_vision_deviation(model) -> dict | None:
    """The deviation a rehearsal lists when it drives a vision-language model with the GPT step's text batches.

    The GPT step feeds ``input_ids``/``labels`` only: the vision tower is built, wrapped and sharded (its weights,
    gradients and optimizer state are in the measurement) but no image passes it. A recipe that trains only a
    part the text never reaches (Qwen3-VL's pretrain recipes freeze both models and train the mergers) then has a
    loss that needs no gradient, and the timed steps run no backward at all."""
    if model is None or choose(model).kind != "gpt" or getattr(model, VISION_FIELD, None) is None:
        return None
    return {
        "id": "vlm-text-only",
        "what": "the recipe's image-text batches -> Bridge's GPT step on mock text (no image)",
        "why": "the rehearsal drives Bridge's GPT step; a vision-language step and its image data are not wired in",
        "memory_effect": "too low by the vision tower's activations; where only a part the text never reaches "
        "trains, too low by the whole backward (every gradient norm 0.0)",
        "time_effect": "the vision tower's forward and backward are not timed",
    }


def forward_step(choice: Choice):
    """The forward step ``choice`` names, imported from Bridge (Wan's is an instance: a functor)."""
    if choice.kind == "wan":
        from megatron.bridge.diffusion.models.wan.wan_step import WanForwardStep

        return WanForwardStep(mode=WAN_STEP_MODE)
    from megatron.bridge.training.gpt_step import forward_step as gpt_forward_step

    return gpt_forward_step


def wan_mock_fields(dataset, seq_length, micro_batch_size: int, global_batch_size: int) -> dict:
    """Keyword arguments for ``WanMockDataModuleConfig``: the recipe dataset's batch shapes where it has
    them (``WAN_MOCK_SHAPE_FIELDS``), else the class's defaults; the job's batch sizes; no worker processes."""
    out = {k: getattr(dataset, k, None) for k in WAN_MOCK_SHAPE_FIELDS}
    out = {k: (WAN_MOCK_DEFAULTS[k] if v is None else int(v)) for k, v in out.items()}
    seq = getattr(dataset, "seq_length", None) or seq_length
    buffer = getattr(dataset, "packing_buffer_size", None) or WAN_PACKING_BUFFER_DEFAULT
    return {
        "seq_length": int(seq),
        "packing_buffer_size": int(buffer),
        "micro_batch_size": int(micro_batch_size),
        "global_batch_size": int(global_batch_size),
        "num_workers": WAN_MOCK_WORKERS,
        **out,
    }


def wan_latent_tokens(fields: dict) -> int:
    """Latent tokens in one mock micro-batch (``mock_batch``: patchified latents of every packed sample)."""
    per_sample = (
        (fields["F_latents"] // fields["patch_temporal"])
        * (fields["H_latents"] // fields["patch_spatial"])
        * (fields["W_latents"] // fields["patch_spatial"])
    )
    return per_sample * fields["number_packed_samples"]


def wan_flops_stats(fields: dict, global_batch_size: int, micro_batch_size: int) -> dict:
    """The sequence sums Bridge's Wan FLOPs need for one step of the mock data, whole job.

    ``WanModelProvider._get_num_floating_point_operations_with_runtime_stats`` raises without them; in a run
    ``WanForwardStep`` accumulates them per micro-batch (``flop_utils.accumulate_flops_metadata`` from the
    batch's ``cu_seqlens``: Σ q, Σ q², and for cross-attention Σ k, Σ q·k over the packed samples) and
    ``train.py`` sums them over the data-parallel ranks. Every mock micro-batch is the same pack of
    ``number_packed_samples`` samples of q latent tokens and k = ``context_seq_len`` text tokens, and a step
    runs global batch / micro-batch of them (one pack per micro-batch, whatever its size)."""
    n = fields["number_packed_samples"]
    q = wan_latent_tokens(fields) // n
    k = fields["context_seq_len"]
    packs = max(int(global_batch_size) // max(int(micro_batch_size), 1), 1)
    return {
        "seqlen_sum": packs * n * q,
        "seqlen_squared_sum": packs * n * q * q,
        "cross_seqlen_sum": packs * n * k,
        "cross_seqlen_product_sum": packs * n * q * k,
    }


def wan_mock_label(fields: dict) -> str:
    """``WanMockDataModuleConfig(...)`` with the fields that size a batch, for the report's settings."""
    shown = ", ".join(f"{k}={fields[k]}" for k in WAN_MOCK_SHAPE_FIELDS)
    return f"WanMockDataModuleConfig({shown}, num_workers={fields['num_workers']})"
