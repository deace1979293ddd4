"""One rehearsal (``scripts/rehearse_train.py``): a Megatron-Bridge job on ONE GPU as rank R of a world of N.

One process is one rehearsal. It builds the job's real ``ConfigContainer`` (a Bridge
YAML, a recipe function, or a named model preset), runs a few real training steps
and writes a JSON report, phase by phase, so that a crash or a kill still leaves
everything that passed.

How a world of N fits on one GPU: PyTorch's ``fake`` distributed backend
(``torch.testing._internal.distributed.fake_pg``) returns from every collective at
once and moves no data, while every allocation of the process is real. A process
that is rank R of a fake world of N builds the same parallel groups, shards the same
tensors and allocates the same buffers as rank R of a real N-GPU job. Values are
wrong on purpose (gathered weights and reduced gradients are garbage), so losses
mean nothing; memory per rank, shapes, wrapping and the code paths taken are real.
Bridge's ``setup()`` skips ``init_process_group`` when a process group exists, so
the fake one is created first.

Settings changed for the fake backend (each recorded in the report with its reason):
``ddp.check_for_nan_in_grad``, ``dist.use_gloo_process_groups``,
``train.exit_signal_handler`` and the rerun state machine's loss checks
(see ``FAKE_BACKEND_SETTINGS``). Settings changed so that a rehearsal is short and
offline (mock data, NullTokenizer, K iterations, no checkpoint reads) are recorded
separately, as are those forced by the environment (no APEX).

The training step and its mock data follow the model provider (``workload.choose``): Bridge's GPT step
on mock GPT data, or for a Wan model (``WanModelProvider``) Bridge's ``WanForwardStep`` on Bridge's Wan
mock data shaped as the recipe's dataset; the save/load check's forward-only loss uses the same step.

Mixture of experts: with plain fake collectives the all-to-all token dispatcher
sizes its buffers from token counts read from memory nobody wrote. With
``--mirror-collectives`` (on by default when the model has experts, and for every fake
``--perf`` run, so that timed steps compute on written values) every rank is
made to look like this one: all-gathers copy the local input into every output
slot, all-to-alls deliver to every slot what this rank sends to itself,
reduce-scatters keep this rank's chunk. The token counts are then consistent and
nothing extra is allocated. ``--balanced-routing`` forces the router to balance.

What is recorded (``report.json`` in ``--out``): every phase's status and wall time
(import, config, validate, initialize, model_build, model_wrap, optimizer, data,
train, save, load); per-phase memory (allocated after the phase, the phase's peak
``max_memory_allocated``, reserved); per step the memory after forward/backward and
after the optimizer step with each part's peak and the memory between steps; the
overall peak and reserved memory; the numel of this rank's local parameters (dense
and expert, trainable) and of the optimizer state and main parameters; the process
groups this rank belongs to (communicators a real job would create); and the first
failure's type, message and innermost frames in megatron/bridge, megatron/core and
megatron_fsdp code.

``--parity`` runs a real world of 1 (no fake backend) twice, under DDP and under
Megatron FSDP, with the same model, data and seed, and compares the losses.

``--perf`` (``rehearse --perf``): ``--warmup`` untimed steps, then ``--iters`` steps timed with
CUDA events, every collective of those steps recorded (``collectives.CollectiveRecorder``,
installed before megatron is imported), and Bridge's model FLOPs per step; the report's ``perf``
record (``perf.record``) is what ``mfsdp_lib.perf`` turns into a prediction. ``--hf-config``
serves recipes their Hugging Face config offline (``hfhub``).

torch and megatron are imported only inside functions, so ``--help`` and the CPU
tests work without them.
"""

from __future__ import annotations

import math
import os
import signal
import sys

from . import bridge, checkpoint, collectives, fakeworld, hfhub, kernel_profile, kernels, mamba, perf, workload
from .args import InputError, check_args, parse_overrides, rehearse_parser, use_fake_pg
from .bridge import Settings, get_dotted
from .collectives import install_mirror_collectives
from .measure import Mem, count_optimizer, count_params
from .parity import run_parity
from .phases import setup_measured
from .presets import NULL_TOKENIZER_VOCAB, PRESETS, decide_meta_init, wants_mamba_ssm
from .report import Report, now_utc, on_sigterm, progress, versions
from .steps import PerfClock, train_measured

PROG = "rehearse_train.py"


def configure(a, cfg, est_params, fake: bool, out_dir: str, ckpt_dir: str | None, mamba_env: dict | None = None):
    """Apply overrides, strategy, fake-backend and rehearsal settings; returns (Settings, facts).

    ``mamba_env`` is what :func:`mamba.prepare_mamba_ssm` found (hybrid models only)."""
    import torch
    from megatron.bridge.training.config import MockGPTDatasetConfig

    s = Settings(cfg)
    facts: dict = {}
    if getattr(a, "comm_overlap_section", False) and getattr(cfg, "comm_overlap", None) is None:
        from megatron.bridge.training.comm_overlap import CommOverlapConfig

        s.apply("comm_overlap", CommOverlapConfig(tp_comm_overlap=False), "rehearsal", "--comm-overlap-section")
    for key, value in parse_overrides(a.overrides).items():
        s.apply(key, value, "user", "KEY=VALUE on the command line")
    strategy = a.strategy or ("optim_grads_params" if a.model_preset else None)
    if strategy:
        for key, value in bridge.strategy_settings(strategy).items():
            s.apply(key, value, "strategy", f"--strategy {strategy}", only_if_present=True)
    facts["strategy"] = strategy or bridge.strategy_of(cfg)
    fsdp = bool(get_dotted(cfg, "ddp.use_megatron_fsdp"))
    if fake:
        for key, (value, why) in fakeworld.FAKE_BACKEND_SETTINGS.items():
            s.apply(key, value, "fake-backend", why)
        for key, (value, why) in fakeworld.FAKE_BACKEND_NCCL_OPTIONS.items():
            if get_dotted(cfg, key):
                s.apply(key, value, "fake-backend", why)
    if fake and get_dotted(cfg, "comm_overlap.tp_comm_overlap") is True:
        s.apply(
            "comm_overlap.tp_comm_overlap",
            False,
            "fake-backend",
            "Transformer Engine's userbuffers need the tensor-parallel group's GPUs (CUDA multicast or IPC)",
        )
        facts.setdefault("deviations", []).append(fakeworld.tp_comm_overlap_deviation())
    # Rehearsal: short, offline, no checkpoint reads.
    s.apply("train.train_iters", a.iters, "rehearsal", "run only K steps")
    s.apply("train.train_samples", None, "rehearsal", "the run is counted in iterations", only_if_present=True)
    s.apply("validation.eval_iters", 0, "rehearsal", "no evaluation", only_if_present=True)
    s.apply("validation.eval_interval", a.iters + 1, "rehearsal", "no evaluation", only_if_present=True)
    s.apply("logger.log_interval", 1, "rehearsal", "a log line per step")
    for key in ("logger.tensorboard_dir", "logger.wandb_project"):
        s.apply(key, None, "rehearsal", "nothing is written outside --out", only_if_present=True)
    s.apply("checkpoint.load", None, "rehearsal", "a rehearsal starts from fresh weights")
    s.apply("checkpoint.save", ckpt_dir, "rehearsal", "--save-load" if ckpt_dir else "nothing is saved")
    s.apply("checkpoint.save_interval", a.iters if ckpt_dir else None, "rehearsal", "save at the last step only")
    s.apply("checkpoint.async_save", False, "rehearsal", "the save must finish before the load", only_if_present=True)
    if get_dotted(cfg, "scheduler.lr_warmup_iters", 0) and cfg.scheduler.lr_warmup_iters >= a.iters:
        s.apply("scheduler.lr_warmup_iters", 0, "rehearsal", "warm-up longer than K steps")
    if get_dotted(cfg, "scheduler.lr_decay_iters") is not None and cfg.scheduler.lr_decay_iters < a.iters:
        s.apply("scheduler.lr_decay_iters", a.iters, "rehearsal", "decay shorter than K steps")
    choice = workload.choose(get_dotted(cfg, "model"))
    text_only = workload.text_only_vision_deviation(get_dotted(cfg, "model"))
    if text_only:
        facts.setdefault("deviations", []).append(text_only)
    if choice.kind == "wan":
        facts["workload"] = choice._asdict()
        fields = workload.wan_mock_fields(
            cfg.dataset,
            get_dotted(cfg, "model.seq_length") or a.seq_length,
            get_dotted(cfg, "train.micro_batch_size") or 1,
            get_dotted(cfg, "train.global_batch_size") or 1,
        )
        old = type(cfg.dataset).__name__
        cfg.dataset = bridge.wan_mock_dataset(fields)
        facts["workload"]["latent_tokens_per_micro_batch"] = workload.wan_latent_tokens(fields)
        s.rows.append(
            {
                "key": "dataset",
                "value": workload.wan_mock_label(fields),
                "was": old,
                "category": "rehearsal",
                "why": "Bridge's own Wan mock data (what WanDatasetConfig builds without a path), its latent and "
                "text shapes from the recipe: nothing is read or downloaded; batches made in this process",
            }
        )
    elif not isinstance(cfg.dataset, MockGPTDatasetConfig):
        seq = get_dotted(cfg, "model.seq_length") or a.seq_length
        old = type(cfg.dataset).__name__
        cfg.dataset = bridge.mock_dataset(seq)
        s.rows.append(
            {
                "key": "dataset",
                "value": f"MockGPTDatasetConfig(seq_length={seq})",
                "was": old,
                "category": "rehearsal",
                "why": "mock data: nothing is read or downloaded",
            }
        )
    tok = get_dotted(cfg, "tokenizer.tokenizer_type")
    if tok != "NullTokenizer":
        vocab = get_dotted(cfg, "model.vocab_size") or NULL_TOKENIZER_VOCAB
        cfg.tokenizer = bridge.null_tokenizer(vocab)
        s.rows.append(
            {
                "key": "tokenizer",
                "value": f"NullTokenizer(vocab_size={vocab})",
                "was": tok,
                "category": "rehearsal",
                "why": "no tokenizer files are read or downloaded",
            }
        )
    # Batch: at least one micro-batch per data-parallel rank.
    mbs = get_dotted(cfg, "train.micro_batch_size") or 1
    mp = (
        (get_dotted(cfg, "model.tensor_model_parallel_size") or 1)
        * (get_dotted(cfg, "model.pipeline_model_parallel_size") or 1)
        * (get_dotted(cfg, "model.context_parallel_size") or 1)
    )
    dp = max(a.world_size // mp, 1)
    gbs = get_dotted(cfg, "train.global_batch_size") or 0
    if a.model_preset:
        asked = a.global_batch_size or parse_overrides(a.overrides).get("train.global_batch_size")
        want = asked or dp * mbs
        s.apply(
            "train.global_batch_size",
            want,
            "rehearsal",
            "one micro-batch per data-parallel rank and step" if not asked else "as asked",
        )
    elif gbs < dp * mbs or gbs % (dp * mbs):
        s.apply(
            "train.global_batch_size",
            dp * mbs * max(gbs // (dp * mbs), 1),
            "rehearsal",
            "global batch must be a multiple of DP x micro-batch",
        )
    facts["data_parallel_size"] = dp
    # --perf-micro-batches K: run K of the step's M micro-batches (perf.record scales them to the step).
    k = getattr(a, "perf_micro_batches", None)
    if k:
        gbs_full = int(get_dotted(cfg, "train.global_batch_size") or dp * mbs)
        m_full = max(gbs_full // (dp * mbs), 1)
        facts["perf_scaling"] = {
            "micro_batches_full": m_full,
            "global_batch_size_full": gbs_full,
            "micro_batches_run": min(k, m_full),
        }
        if k < m_full:
            s.apply(
                "train.global_batch_size",
                k * dp * mbs,
                "rehearsal",
                f"--perf-micro-batches {k}: {k} of the step's {m_full} micro-batches run, the time scaled to the step",
            )
    # Environment: APEX's fused wgrad kernel.
    if get_dotted(cfg, "model.gradient_accumulation_fusion") and not bridge.apex_fused_wgrad_available():
        if getattr(a, "te_grad_accum_fusion", False):
            facts["te_only_grad_accum_fusion"] = True
            facts.setdefault("deviations", []).append(bridge.te_only_grad_accum_fusion_deviation())
        else:
            s.apply(
                "model.gradient_accumulation_fusion",
                False,
                "environment",
                "APEX's fused_weight_gradient_mlp_cuda is not installed",
            )
    elif getattr(a, "te_grad_accum_fusion", False):
        facts["te_grad_accum_fusion_ignored"] = "the config does not ask for the fusion, or APEX is installed"
    # MoE.
    experts = get_dotted(cfg, "model.num_moe_experts")
    facts["moe"] = bool(experts)
    if a.balanced_routing:
        if experts:
            s.apply("model.moe_router_force_load_balancing", True, "rehearsal", "--balanced-routing")
        else:
            facts["balanced_routing_ignored"] = "the model has no experts"
    # Packages the config needs beyond Bridge, looked for before the model is built (kernels.missing_for).
    model = get_dotted(cfg, "model")
    backend = kernels.flex_backend(
        get_dotted(cfg, "model.moe_token_dispatcher_type"),
        get_dotted(cfg, "model.moe_flex_dispatcher_backend"),
        get_dotted(cfg, "model.moe_enable_deepep"),
    )
    fallback = getattr(a, "moe_dispatcher", None)
    if fallback and experts and backend is not None:
        s.apply("model.moe_token_dispatcher_type", fallback, "environment", f"--moe-dispatcher {fallback}")
        if get_dotted(cfg, "model.moe_enable_deepep"):
            s.apply("model.moe_enable_deepep", False, "environment", f"--moe-dispatcher {fallback}")
        facts.setdefault("deviations", []).append(kernels.dispatcher_fallback(backend, fallback))
    elif fallback:
        facts["moe_dispatcher_ignored"] = "the config's token dispatcher is not flex (or the model has no experts)"
    missing = kernels.missing_for(
        model, mamba.model_has_mamba(model), bool((mamba_env or {}).get("importable")) if mamba_env else False
    )
    if missing:
        raise InputError(missing[0]["refusal"])
    # Hybrid (Mamba) layers: what this machine's mamba-ssm can run (prepare_mamba_ssm, before the import).
    if mamba.model_has_mamba(model):
        requested = bool(get_dotted(cfg, "model.use_mamba_mem_eff_path", True))
        extra = mamba.unfused_mamba_extra_bytes(model, mbs) if requested else None
        deviations, mem_eff_off = mamba.mamba_deviations(mamba_env, requested, extra)
        if mem_eff_off:
            s.apply(
                "model.use_mamba_mem_eff_path",
                False,
                "environment",
                "causal-conv1d's compiled functions are not installed; the memory-efficient Mamba kernel needs them",
            )
        pattern = get_dotted(cfg, "model.hybrid_layer_pattern") or get_dotted(cfg, "model.hybrid_override_pattern")
        facts["hybrid"] = {
            "mamba_layers": mamba.mamba_layer_count(pattern) if pattern else None,
            "mem_eff_path_requested": requested,
            "mem_eff_path_used": requested and not mem_eff_off,
            "mamba_ssm": {k: (mamba_env or {}).get(k) for k in ("version", "importable", "mamba1_kernel", "error")},
        }
        facts.setdefault("deviations", []).extend(deviations)
    # PEFT: Bridge validates that a pretrained checkpoint path exists; the rehearsal's
    # pre-wrap hook adds the adapters without reading it (bridge.peft_hook_without_checkpoint).
    if get_dotted(cfg, "peft") is not None:
        current = get_dotted(cfg, "checkpoint.pretrained_checkpoint")
        if not current or not os.path.exists(str(current)):
            placeholder = os.path.join(out_dir, "pretrained_placeholder")
            os.makedirs(placeholder, exist_ok=True)
            s.apply(
                "checkpoint.pretrained_checkpoint",
                placeholder,
                "rehearsal",
                "PEFT validation needs an existing path; the adapters go onto random base weights, nothing is read",
            )
    # Meta-device init.
    props = torch.cuda.get_device_properties(0)
    meta, why = decide_meta_init(a.meta_init, fsdp, est_params, props.total_memory)
    if meta:
        s.apply("model.init_model_with_meta_device", True, "rehearsal", why)
    facts["meta_init"] = {
        "used": bool(get_dotted(cfg, "model.init_model_with_meta_device")),
        "why": why,
        "estimated_parameters": est_params,
    }
    return s, facts


def run_once(a, report: Report, fake: bool) -> int:
    """Every phase of one rehearsal, recorded in ``report``; returns 0 (a failure raises)."""
    import gc
    import shutil

    out = os.path.abspath(a.out)
    ckpt_dir = os.path.join(out, "checkpoint") if a.save_load else None
    mem = Mem()
    report.begin("initialize_process_group")
    pg = fakeworld.init_process_group(a, fake)
    report.data["process_group"] = pg
    report.end()

    cfg = None
    report.begin("import")
    mirror = a.mirror
    if mirror is None and a.model_preset:
        mirror = bool(PRESETS[a.model_preset].get("num_moe_experts"))
    # For YAML/recipe sources MoE is known only after the config is built, which needs
    # Bridge imported; the mirror must be installed before that import. Default: on for
    # every fake run of a YAML/recipe (on a dense model it changes no allocation).
    if mirror is None:
        mirror = fake
    if getattr(a, "perf", False) and a.mirror is None and fake:
        # --perf times the steps: every gathered weight must hold real values (this rank's shard in every
        # slot), or the unwritten memory can hold NaN and a NaN step runs faster (perf.record counts them)
        mirror = True
    if fake and a.save_load and not mirror:
        # the checkpoint's plan exchange (all_gather_object, gather/scatter of plans) must
        # carry real objects: without the mirror they are read from unwritten memory
        mirror = True
        report.data["mirror_collectives_why"] = "forced on by --save-load under the fake backend"
    mirror = bool(mirror and fake)
    report.data["mirror_collectives"] = install_mirror_collectives() if mirror else []
    if mirror and getattr(a, "perf", False):
        report.data["mirror_collectives_copy"] = (
            "on: every all-gather's output holds this rank's shard in each slot (the writes a real all-gather "
            "makes, issued on the caller's stream), so the timed steps compute on real values"
        )
    recorder = None
    if getattr(a, "perf", False):
        # after the mirror, so that the recorder is the outer wrapper; before megatron binds collectives
        recorder = collectives.CollectiveRecorder()
        recorder.install()
    hf_state = hfhub.prepare(getattr(a, "hf_config", None), out)  # before huggingface_hub is imported
    if hf_state["cache"]:
        report.data["hf_configs"] = {"cache": hf_state["cache"], "ids": sorted(hf_state["ids"])}
    if fake and a.save_load:
        report.data["checkpoint_planner"] = fakeworld.install_lowest_rank_checkpoint_planner()
        report.data["global_plan_checks"] = fakeworld.GLOBAL_PLAN_CHECKS  # the same list: filled by each save
    mamba_env = None
    if wants_mamba_ssm(a):
        # megatron-core's Mamba mixer binds mamba-ssm's kernels when it is imported: prepare them first
        mamba_env = mamba.prepare_mamba_ssm()
        report.data["mamba_ssm"] = mamba_env
    import megatron.bridge  # noqa: F401
    from megatron.bridge.training.gpt_step import forward_step

    report.data["hf_guard"] = hfhub.guard(hf_state, InputError) if a.recipe else None
    if fake:
        # FP8 primary weights re-quantized after each step: keep the scales a real amax all-reduce would give
        what = fakeworld.install_fp8_scale_keeper()
        report.data["fp8_scale_keeper"] = {"what": what, "state": fakeworld.FP8_SCALE_KEEPER} if what else None
    report.end()

    report.begin("config")
    cfg, est, source = bridge.load_config(a)
    settings, facts = configure(a, cfg, est, fake, out, ckpt_dir, mamba_env)
    report.data["source"] = source
    if "workload" in facts:  # a model that Bridge's GPT step (imported above) cannot drive: workload.choose
        forward_step = workload.forward_step(
            workload.Choice(**{k: facts["workload"][k] for k in workload.Choice._fields})
        )
    report.data["deviations"] = facts.pop("deviations", [])
    report.data["facts"] = facts
    report.data["settings_applied"] = settings.rows
    report.data["settings_summary"] = {
        cat: [r["key"] for r in settings.rows if r["category"] == cat]
        for cat in ("user", "strategy", "fake-backend", "rehearsal", "environment")
    }
    try:
        cfg.to_yaml(os.path.join(out, "run_config.yaml"))
    except Exception as exc:  # the YAML is a convenience, not a phase
        report.data["run_config_yaml_error"] = f"{type(exc).__name__}: {exc}"
    report.end()

    report.begin("validate")
    from megatron.bridge.training.config import runtime_config_update

    runtime_config_update(cfg)
    report.end()

    report.data["gpu_lock"] = perf.gpu_lock(progress)  # several rehearsals on one GPU: one trains at a time
    if report.data["gpu_lock"]:
        report.data["gpu_lock_wait"] = dict(perf.LOCK_STATE)
    profiler = kernel_profile.StepProfiler() if getattr(a, "profile", False) else None
    clock = PerfClock(a.warmup, recorder, profiler) if recorder is not None else None
    undo_gaf = bridge.allow_grad_accum_fusion_without_apex() if facts.get("te_only_grad_accum_fusion") else None
    try:
        so, manager, meter = setup_measured(cfg, report, mem, clock)
    finally:
        if undo_gaf is not None:
            undo_gaf()
    if undo_gaf is not None:
        report.data["grad_accum_fusion_off_in"] = bridge.mcore_linears_without_fusion(so.model)
    report.data["process_groups"] = fakeworld.process_groups_of_rank()
    report.data["params"] = count_params(
        so.model,
        tp=int(get_dotted(cfg, "model.tensor_model_parallel_size") or 1),
        ep=int(get_dotted(cfg, "model.expert_model_parallel_size") or 1),
        etp=get_dotted(cfg, "model.expert_tensor_parallel_size"),
        pp=int(get_dotted(cfg, "model.pipeline_model_parallel_size") or 1),
    )
    if recorder is not None:
        recorder.schedule_hooks = recorder.track_schedule()
    report.write()

    report.begin("train")
    steps = train_measured(so, manager, meter, forward_step)
    if profiler is not None:
        try:
            report.data["kernel_profile"] = profiler.summary()
        except Exception as exc:  # a measurement: the steps passed; say why the profile is missing
            report.data["kernel_profile"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    kept = fakeworld.FP8_SCALE_KEEPER
    if fake and kept["calls"] and kept["kept_last_call"]:
        report.data["deviations"].append(fakeworld.fp8_scale_deviation(kept))
    if recorder is not None:
        try:
            report.data["perf"] = perf.record(
                cfg,
                so,
                clock,
                recorder,
                a.world_size,
                a.rank,
                report.data["params"],
                report.data.get("device"),
                steps=steps,
                scaling=facts.get("perf_scaling"),
            )
        except Exception as exc:  # a measurement: the steps passed; say why the record is missing
            report.data["perf"] = {"schema": perf.PERF_SCHEMA, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    try:
        report.data["optimizer_state"] = count_optimizer(so.optimizer)
    except Exception as exc:  # a measurement, not a phase: the training steps already passed
        report.data["optimizer_state"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    between = steps[-1]["between_steps_bytes"] if steps else None
    losses = [s.get("loss") for s in steps]
    report.end(
        iterations=len(steps),
        between_steps_bytes=between,
        losses=losses,
        losses_finite=all(x is not None and math.isfinite(x) for x in losses),
        losses_meaningful=not fake,
    )
    report.data["memory"] = {
        "after_setup_bytes": report.data["phases"].get("data", {}).get("allocated_bytes"),
        "between_steps_bytes": between,
        "steps": steps,
        **mem.overall(),
    }
    report.write()

    if a.save_load and ckpt_dir:
        # The config holds the model too (Bridge puts the chunks' no_sync/grad_sync methods
        # on the model config): drop both, so the loaded model is not built beside the old one.
        cfg = None
        holder = [so]
        del so  # save_load drops the last reference before the fresh model is built
        try:
            save_load(a, holder, report, mem, forward_step, fake, ckpt_dir, mamba_env)
        finally:
            if ckpt_dir and os.path.isdir(ckpt_dir):
                report.data.setdefault("save_load", {})["checkpoint_files"] = checkpoint.listing(ckpt_dir)
                shutil.rmtree(ckpt_dir, ignore_errors=True)
                report.write()
    else:
        checkpoint.finish(so)
        del so
    gc.collect()
    return 0


def save_load(
    a, holder, report: Report, mem: Mem, forward_step, fake: bool, ckpt_dir: str, mamba_env: dict | None = None
) -> None:
    """``--save-load``: finish the save issued at the last step, then load it into a fresh model built the
    same way and compare the forward-only loss on the next batch (real worlds only; fake losses are garbage).

    ``holder`` holds the only reference to what ``setup()`` returned: it is dropped before the fresh model
    is built."""
    import gc

    import torch

    so = holder.pop()
    sl = report.data.setdefault("save_load", {})
    report.begin("save")
    before = checkpoint.forward_only_loss(forward_step, so)
    checkpoint.finish(so)  # the save at the last step was issued by train()
    torch.distributed.barrier()
    files = checkpoint.listing(ckpt_dir)
    sl.update(loss_before_save=before, files_after_save=len(files), bytes_after_save=sum(f[1] for f in files))
    if not files:
        raise RuntimeError(f"no checkpoint files were written under {ckpt_dir}")
    report.end(**mem.snap())

    report.begin("load")
    step_saved = int(so.state.train_state.step)
    del so
    gc.collect()
    torch.cuda.empty_cache()
    # A fresh container built the same way (setup() mutates the first one), loading the checkpoint.
    cfg2, est, _ = bridge.load_config(a)
    _, facts2 = configure(a, cfg2, est, fake, os.path.abspath(a.out), None, mamba_env)
    undo_gaf = bridge.allow_grad_accum_fusion_without_apex() if facts2.get("te_only_grad_accum_fusion") else None
    try:
        so2 = checkpoint.load_fresh(cfg2, ckpt_dir)
    finally:
        if undo_gaf is not None:
            undo_gaf()
    if undo_gaf is not None:
        bridge.mcore_linears_without_fusion(so2.model)
    after = checkpoint.forward_only_loss(forward_step, so2)
    resumed = int(so2.state.train_state.step)
    checkpoint.finish(so2)
    delta, agree = checkpoint.losses_agree(before, after)
    sl.update(
        loss_after_load=after,
        saved_iteration=step_saved,
        resumed_iteration=resumed,
        abs_delta=delta,
        rtol=checkpoint.RESUME_RTOL,
        atol=checkpoint.RESUME_ATOL,
        losses_compared=not fake,
        equal=None if fake or before is None else agree,
    )
    if resumed != step_saved:
        raise RuntimeError(f"loaded iteration {resumed}, saved {step_saved}")
    if not fake and not sl["equal"]:
        raise RuntimeError(f"forward loss changed across save/load: {before} -> {after}")
    report.end(**mem.snap())
    del so2


def main(argv=None) -> int:
    """``rehearse_train.py``: exit 0 all phases passed, 1 a phase failed, 2 refused."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = rehearse_parser()
    a = parser.parse_intermixed_args(argv)
    try:
        check_args(a)
        parse_overrides(a.overrides)
    except InputError as exc:
        sys.stderr.write(f"{PROG}: {exc}\n")
        return 2
    try:
        import torch
    except ImportError:
        sys.stderr.write("rehearse_train.py: needs PyTorch with CUDA and Megatron-Bridge (torch is not installed)\n")
        return 2
    if not torch.cuda.is_available():
        sys.stderr.write("rehearse_train.py: needs a CUDA GPU (torch.cuda.is_available() is False)\n")
        return 2
    import importlib.util

    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.bridge") is None:
        sys.stderr.write("rehearse_train.py: needs Megatron-Bridge (megatron.bridge is not importable)\n")
        return 2
    if a.parity:
        return run_parity(a, argv)

    bridge.unset_cuda_device_max_connections()
    fake = use_fake_pg(a)
    timed = a.iters
    if a.perf:
        a.iters = a.warmup + timed  # the run's steps: warm-up, then the timed ones
    report = Report(
        os.path.abspath(a.out),
        {
            "argv": argv,
            "started_utc": now_utc(),
            "request": {
                "world_size": a.world_size,
                "rank": a.rank,
                "iters": a.iters,
                "perf": a.perf,
                "warmup": a.warmup if a.perf else None,
                "timed_iters": timed if a.perf else None,
                "perf_micro_batches": a.perf_micro_batches,
                "moe_dispatcher": a.moe_dispatcher,
                "hf_config": a.hf_config,
                "strategy": a.strategy,
                "fake_pg": fake,
                "meta_init": a.meta_init,
                "balanced_routing": a.balanced_routing,
                "mirror_collectives": a.mirror,
                "peft": a.peft,
                "save_load": a.save_load,
                "overrides": a.overrides,
                "seq_length": a.seq_length,
                "micro_batch_size": a.micro_batch_size,
            },
            "device": torch.cuda.get_device_name(0),
            "versions": versions(),
            "host_pid": os.getpid(),
        },
    )
    report.write()
    signal.signal(signal.SIGTERM, on_sigterm)
    rc = 1
    try:
        rc = run_once(a, report, fake)
        report.data["result"] = "passed"
    except InputError as exc:
        report.fail(exc)
        sys.stderr.write(f"{PROG}: {exc}\n")
        rc = 2
    except BaseException as exc:
        report.fail(exc)
        rc = 1
    finally:
        report.data["finished_utc"] = now_utc()
        try:
            import torch

            if torch.cuda.is_available() and "memory" not in report.data:
                report.data["memory"] = Mem().overall()
        except Exception:
            pass
        report.write()
    progress(f"result: {report.data['result']} -> {report.path}")
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass
    return rc
