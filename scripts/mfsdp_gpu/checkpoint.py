"""Checkpoint helpers: the save at the end of training, loading into a fresh model, the round-trip verdict.

A save/load round trip is judged by one forward-only pass over the same next batch before the save
and after the load: the loaded train state restores the consumed-samples counter, so equal weights
give an equal loss. The functions take what Bridge's ``setup()`` returns (``so``: state, model,
optimizer, iterators, checkpoint manager, process groups) and a container, whatever the format
(``torch_dist`` or ``fsdp_dtensor``), so that any run that builds a model from a config can save it
and load it again with them.
"""

from __future__ import annotations

import os

# Save/load round trip: forward-only loss before the save and after the load agree within
# torch.testing's default tolerance for bf16 (rtol 1.6e-2, atol 1e-5): the model computes in
# bf16, so that is the finest difference that means anything.
RESUME_RTOL = 1.6e-2
RESUME_ATOL = 1e-5


def forward_only_loss(forward_step_func, so) -> float | None:
    """One forward-only pass over the next global batch; the reduced LM loss.

    Same data position before save and after load (the loaded train state restores
    the consumed-samples counter), so equal weights give an equal loss.
    """
    import torch
    from megatron.bridge.training.utils.train_utils import prepare_forward_step_func
    from megatron.core.num_microbatches_calculator import get_num_microbatches
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
    from megatron.core.pipeline_parallel.schedules import get_forward_backward_func
    from megatron.core.utils import get_model_config

    state, model, pgs = so.state, so.model, so.pg_collection
    cfg = state.cfg
    fwd_bwd = get_forward_backward_func(pp_size=pgs.pp.size(), vp_size=cfg.model.virtual_pipeline_model_parallel_size)
    for chunk in model:
        chunk.eval()
    with torch.no_grad():
        out = fwd_bwd(
            forward_step_func=prepare_forward_step_func(forward_step_func, state),
            data_iterator=so.train_data_iterator,
            model=model,
            num_microbatches=get_num_microbatches(),
            seq_length=cfg.model.seq_length,
            micro_batch_size=cfg.train.micro_batch_size,
            decoder_seq_length=cfg.model.seq_length,
            forward_only=True,
            p2p_communicator=P2PCommunicator(pp_group=pgs.pp, config=get_model_config(model[0])),
            pg_collection=pgs,
        )
    if not out:
        return None  # not the last pipeline stage
    key = next(k for k in out[0] if "loss" in k)
    parts = [x[key].view(-1).float() for x in out]
    if parts[0].numel() == 2:  # (sum of token losses, token count): reduce over data parallel ranks
        tot = torch.vstack(parts).sum(dim=0)
        torch.distributed.all_reduce(tot, group=pgs.dp_cp)
        return float(tot[0] / tot[1])
    return float(torch.cat(parts).mean())


def losses_agree(before: float | None, after: float | None) -> tuple[float | None, bool]:
    """``(|after - before|, whether they agree within RESUME_ATOL + RESUME_RTOL x |before|)``;
    ``(None, False)`` when either loss is missing (a stage without the loss)."""
    delta = None if before is None or after is None else abs(after - before)
    return delta, delta is not None and before is not None and delta <= RESUME_ATOL + RESUME_RTOL * abs(before)


def finish(so) -> None:
    """End a run the way Bridge's ``train()`` ends one: the save it issued at the last step is
    completed (and any async save awaited), loggers closed."""
    from megatron.bridge.training.train import _finish_train

    _finish_train(so.state, so.checkpoint_manager)


def load_fresh(cfg, ckpt_dir: str):
    """A fresh model from ``cfg`` loading ``ckpt_dir`` (nothing saved): the checkpoint paths are set,
    Bridge's ``runtime_config_update`` validates the container, ``setup()`` builds the model and
    restores it with its optimizer and train state. Returns what ``setup()`` returns."""
    from megatron.bridge.training.config import runtime_config_update

    from .bridge import setup

    cfg.checkpoint.load = ckpt_dir
    cfg.checkpoint.save = None
    runtime_config_update(cfg)
    if cfg.peft is None:
        return setup(cfg)
    # PEFT: the base weights come from no pretrained checkpoint here either (bridge.peft_hook_without_checkpoint);
    # the adapters are then restored from the rehearsal's own checkpoint
    import megatron.bridge.training.setup as setup_mod

    from .bridge import peft_hook_without_checkpoint

    orig = setup_mod._create_peft_pre_wrap_hook
    setup_mod._create_peft_pre_wrap_hook = peft_hook_without_checkpoint()
    try:
        return setup(cfg)
    finally:
        setup_mod._create_peft_pre_wrap_hook = orig


def listing(root: str) -> list:
    """``[relative path, size]`` of every file under ``root``, sorted."""
    rows = []
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            try:
                rows.append([os.path.relpath(p, root), os.path.getsize(p)])
            except OSError:
                pass
    return sorted(rows)
