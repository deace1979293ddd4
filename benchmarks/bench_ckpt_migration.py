#!/usr/bin/env python3
"""Evidence for ``mfsdp.py convert``: each checkpoint migration run on one H200 and its weights checked.

Run on a GPU machine prepared with ``tests/gpu/setup_device.sh`` (Megatron-Bridge 0.6.2, Transformer Engine,
transformers 5.x)::

    python3 benchmarks/bench_ckpt_migration.py --out RAW

What it does, and why this way:

* Two models, random-initialised from a ``transformers`` config saved with ``save_pretrained`` on the machine
  (no hub, no downloads): a tiny Llama (dense) and a tiny Qwen3-MoE (4 experts, top-2). World size 1 for
  real: a real NCCL group of one on one GPU, so expert parallelism is 1 (EP > 1 needs more ranks than one
  GPU can host) and no resharding across data-parallel sizes is covered.
* The runs are set up by the GPU package (``scripts/mfsdp_gpu/bridge.py``: mock data, NullTokenizer, Adam in
  bf16, no APEX, Megatron FSDP's settings from ``mfsdp_lib.enable``), around the Hugging Face model's provider
  (``AutoBridge.to_megatron_provider``), with a flat learning rate: a conversion does not carry the scheduler.
* One process per model (Bridge's import costs about 30 s), run side by side on the GPU; one failing row
  never stops the others (each row is its own try block, and writes ``RAW/<row>.json`` and ``RAW/<row>.log``
  as soon as it ends). Every conversion is the real command line, ``mfsdp.py convert``, run in-process
  through ``mfsdp.main`` so no extra interpreter pays the import again.
* Runs, on the same mock data (same seed, same order): U = distributed optimizer for N steps from random
  initialisation, saving torch_dist every K steps; then
  (a) torch_dist@K -> fsdp_dtensor, resumed under Megatron FSDP optim_grads_params to N (saving fsdp_dtensor):
      its first resumed loss against U's loss at the same step (same weights, same batch: only bf16 noise
      may differ), and the later steps' difference = what dropping the optimizer state costs;
  (b) that FSDP run's final fsdp_dtensor -> hf: logits of ``transformers`` on fixed tokens against the
      Megatron FSDP model's logits at the same weights (the live model after its last step);
  (c) fsdp_dtensor@2K -> torch_dist, resumed under the distributed optimizer to N: first resumed loss against
      the FSDP run's loss at that step;
  (d) hf (the initial random model) -> fsdp_dtensor, loaded as checkpoint.pretrained_checkpoint by a
      Megatron FSDP fine-tune: its logits against ``transformers``' on the same folder, then two steps.
  Dense runs (a)-(d); MoE runs (a) and (b). Afterwards the dense process tries the conversion paths that the
  installed Bridge itself offers (``AutoBridge.export_ckpt``, ``AutoBridge.import_ckpt``) and records whether
  the repositories' converters are in the installed packages, with the exact failure of each.

Tolerances (bf16: 8 significant bits, about 3.9e-3 relative per rounding):
* losses: |a - b| <= LOSS_RTOL * |b| with LOSS_RTOL = 1.6e-2, torch.testing's bf16 rtol: equal weights and data
  differ only by kernel order between DDP and Megatron FSDP;
* logits: max |a - b| / max |b| <= LOGITS_RTOL = 5e-2: two different attention/MLP implementations
  (Transformer Engine vs transformers' eager PyTorch) round differently at every layer; a wrong mapping
  (swapped gate/up, Q/K/V order, a transposed expert) gives a relative difference of order 1.

Turn RAW into the result file with ``benchmarks/ckpt_migration_result.py RAW --out
benchmarks/results/ckpt_migration_1xh200.json``. Budget: the whole driver ends within ``--budget-s``
(default 470 s): each worker is killed at the deadline and what it wrote stays.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPTS = os.path.join(ROOT, "scripts")
if SCRIPTS not in sys.path:
    sys.path.insert(0, SCRIPTS)

LOSS_RTOL = 1.6e-2  # torch.testing's default rtol for bfloat16
LOGITS_RTOL = 5e-2  # max |diff| / max |logit|; see the module docstring
K = 4  # steps between saves
N = 12  # steps of every training run (saves at K, 2K, 3K)
SEQ = 128
GBS = 4
MBS = 1
LR = 1e-3  # large enough that a restarted Adam shows in the loss within K steps
VOCAB = 2048  # divisible by 128: Megatron pads nothing, so logits compare column for column
SEED = 1234
LOGIT_TOKENS = (2, 64)  # fixed tokens for the logits comparisons
DEFAULT_BUDGET_S = 470  # under 8 minutes with the launcher's own start-up
MASTER_PORT_BASE = 29571  # one port per worker process
WORKERS = {"dense": ("a", "b", "c", "d", "upstream"), "moe": ("a", "b")}

# The repositories' converters (NVIDIA-NeMo/Megatron-Bridge examples/conversion/mfsdp/, NVIDIA/Megatron-LM
# tools/checkpoint/): looked for in the installed packages.
REPOSITORY_CONVERTERS = ("convert_checkpoints_fsdp.py", "checkpoint_inspector.py")

ROW_NAMES = {
    "a": ("torch_dist", "fsdp_dtensor"),
    "b": ("fsdp_dtensor", "hf"),
    "c": ("fsdp_dtensor", "torch_dist"),
    "d": ("hf", "fsdp_dtensor"),
}


# ------------------------------------------------------------------------------------------------------------
# Launcher
# ------------------------------------------------------------------------------------------------------------


def launch(out: str, budget_s: float, only: list[str], work: str) -> int:
    os.makedirs(out, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    work = tempfile.mkdtemp(prefix="run-", dir=work)  # a fresh folder: a rerun never resumes an old checkpoint
    print(f"[bench_ckpt_migration] models and checkpoints in {work}", flush=True)
    deadline = time.monotonic() + budget_s
    procs = {}
    for i, name in enumerate(only):
        log = open(os.path.join(out, f"worker_{name}.log"), "w")  # noqa: SIM115 (closed when the worker ends)
        env = dict(os.environ)
        if env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":  # Megatron FSDP needs it unset or > 1
            del env["CUDA_DEVICE_MAX_CONNECTIONS"]
        # A real process group of one per worker (what torchrun --nproc_per_node=1 would set), each on its own port.
        env.update(
            RANK="0",
            LOCAL_RANK="0",
            WORLD_SIZE="1",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(MASTER_PORT_BASE + i),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
        )
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", name, "--out", out, "--work", work]
        procs[name] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env), log)
        print(f"[bench_ckpt_migration] started worker {name} (pid {procs[name][0].pid})", flush=True)
    status = {}
    while procs:
        for name, (p, log) in list(procs.items()):
            rc = p.poll()
            if rc is None and time.monotonic() > deadline:
                p.kill()
                rc = p.wait()
                status[name] = {"exit": rc, "killed_at_budget_s": budget_s}
            elif rc is not None:
                status[name] = {"exit": rc}
            if rc is not None:
                log.close()
                del procs[name]
                print(f"[bench_ckpt_migration] worker {name} ended: {status[name]}", flush=True)
        time.sleep(1.0)
    with open(os.path.join(out, "workers.json"), "w") as fh:
        json.dump({"workers": status, "budget_s": budget_s}, fh, indent=1)
    rows = sorted(f for f in os.listdir(out) if f.endswith(".json") and f != "workers.json")
    print(f"[bench_ckpt_migration] {len(rows)} row files in {out}", flush=True)
    return 0 if all(s.get("exit") == 0 for s in status.values()) else 1


# ------------------------------------------------------------------------------------------------------------
# Worker: rows, logs
# ------------------------------------------------------------------------------------------------------------


class Row:
    """One row: its JSON and its log, written when the row ends however it ends."""

    def __init__(self, out: str, name: str, **fields):
        self.out, self.name = out, name
        self.data = {"row": name, "passed": False, "exit": None, "difference": None, **fields}
        self.lines: list[str] = []
        self.t0 = time.monotonic()

    def log(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:7.1f}s] {msg}"
        self.lines.append(line)
        print(f"[{self.name}] {msg}", flush=True)

    def __enter__(self):
        self.log("start")
        return self

    def __exit__(self, et, ev, tb):
        if et is not None:
            self.data["error"] = f"{et.__name__}: {str(ev).splitlines()[0] if str(ev) else ''}"[:2000]
            self.lines.append(traceback.format_exc()[-6000:])
            self.data["passed"] = False
        self.data["wall_s"] = round(time.monotonic() - self.t0, 1)
        self.log(f"end: passed={self.data['passed']} difference={self.data['difference']}")
        with open(os.path.join(self.out, f"{self.name}.json"), "w") as fh:
            json.dump(self.data, fh, indent=1, default=str)
        with open(os.path.join(self.out, f"{self.name}.log"), "w") as fh:
            fh.write("\n".join(self.lines) + "\n")
        return et is not None and issubclass(et, Exception)  # one failing row never stops the next


def run_convert(row: Row, src: str, dst: str, to: str, hf_config: str | None = None) -> int:
    """The real CLI, in-process: ``mfsdp.py convert SRC DST --to TO``; its output goes into the row's log."""
    import mfsdp

    argv = ["convert", src, dst, "--to", to] + (["--hf-config", hf_config] if hf_config else [])
    row.data["command"] = "python3 scripts/mfsdp.py " + " ".join(argv)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        rc = mfsdp.main(argv)
    row.lines.extend(buf.getvalue().splitlines())
    row.data["exit"] = rc
    row.log(f"convert exit {rc}")
    return rc


# ------------------------------------------------------------------------------------------------------------
# Worker: models, configs, training
# ------------------------------------------------------------------------------------------------------------


def make_hf_model(kind: str, path: str) -> str:
    import torch
    import transformers

    if kind == "dense":
        cfg = transformers.LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            tie_word_embeddings=False,
            rms_norm_eps=1e-5,
        )
    else:
        cfg = transformers.Qwen3MoeConfig(
            vocab_size=VOCAB,
            hidden_size=256,
            intermediate_size=512,
            moe_intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            num_experts=4,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
            max_position_embeddings=512,
            tie_word_embeddings=False,
        )
    torch.manual_seed(SEED)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    model.save_pretrained(path)
    save_tiny_tokenizer(transformers, path)
    return path


def save_tiny_tokenizer(transformers, path: str) -> None:
    """A word-level tokenizer over the model's vocabulary, saved beside the weights.

    A real Hugging Face model folder carries its tokenizer, and ``AutoBridge.save_hf_pretrained``
    copies it into the export (it raises when the folder has none); the random models here get
    one so that the export runs the path users take.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token=f"t{VOCAB - 1}")
    fast.save_pretrained(path)


def provider_for(hf_dir: str):
    import torch
    from megatron.bridge import AutoBridge

    p = AutoBridge.from_hf_pretrained(hf_dir).to_megatron_provider(load_weights=False)
    for k, v in dict(
        seq_length=SEQ,
        bf16=True,
        fp16=False,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        gradient_accumulation_fusion=False,  # no APEX in pip installs
        attention_dropout=0.0,
        hidden_dropout=0.0,
        tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1,
        context_parallel_size=1,
        expert_model_parallel_size=1,
        sequence_parallel=False,
    ).items():
        setattr(p, k, v)
    return p


# The strategies of the runs, as scripts/mfsdp_gpu/bridge.py names them (Megatron FSDP's settings are the ones
# `mfsdp.py enable` applies: mfsdp_lib.enable.MINIMAL_OVERRIDES).
DISTOPT, FSDP = "distopt", "optim_grads_params"


def build_cfg(hf_dir, strategy, *, save=None, load=None, pretrained=None, iters=N, save_interval=K):
    """The GPU package's container (mock data, NullTokenizer, Adam, bf16) around the Hugging Face model's
    provider, with what differs here: a flat learning rate and no weight decay (a conversion does not carry
    the scheduler, so the schedule must not change at the resume), and the checkpoint paths."""
    from mfsdp_gpu import bridge

    converted = load is not None or pretrained is not None
    cfg = bridge.config_container(
        provider_for(hf_dir),
        iters=iters,
        global_batch_size=GBS,
        micro_batch_size=MBS,
        warmup_iters=0,
        checkpoint=dict(
            save=save,
            load=load,
            pretrained_checkpoint=pretrained,
            save_interval=save_interval if save else None,
            # a converted checkpoint carries weights and train state only (mfsdp.py convert --help)
            load_optim=not converted,
            load_rng=not converted,
        ),
        train=dict(exit_signal_handler=False),
    )
    cfg.tokenizer = bridge.null_tokenizer(VOCAB - 1)  # its vocabulary (+ EOD) fits the model's
    cfg.optimizer.lr = cfg.optimizer.min_lr = LR
    cfg.optimizer.weight_decay = 0.0
    cfg.scheduler.lr_decay_style = "constant"
    cfg.scheduler.start_weight_decay = cfg.scheduler.end_weight_decay = 0.0
    for key, value in bridge.strategy_settings(strategy).items():
        bridge.set_dotted(cfg, key, value)
    return cfg


def _validated(cfg) -> None:
    from mfsdp_gpu import bridge

    verdict = bridge.validate(cfg)  # Bridge's runtime_config_update, ending in ConfigContainer.validate()
    if not verdict["ok"]:
        raise RuntimeError(f"Bridge rejected the config: {verdict['error_type']}: {verdict['error']}")


def train_run(row: Row, cfg, probe=None):
    """Bridge's own setup + train; per-step losses {iteration: loss}, the first iteration, ``probe(setup_out)``.

    ``probe`` runs on the live model after the last step and before ``_finish_train``, which destroys the
    parallel state the model's forward needs."""
    import torch
    from megatron.bridge.training.gpt_step import forward_step

    from mfsdp_gpu import bridge, checkpoint, steps

    losses: dict[int, float] = {}

    def on_end(ctx):
        loss = steps.step_loss(ctx)
        if loss is not None:
            losses[int(ctx.state.train_state.step)] = loss

    _validated(cfg)
    manager = bridge.callback_manager()
    manager.register("on_train_step_end", on_end)
    so = bridge.setup(cfg, manager)
    start = int(so.state.train_state.step)
    row.log(f"setup done; starting at iteration {start}")
    steps.run_train(so, manager, forward_step)
    torch.cuda.synchronize()
    end = int(so.state.train_state.step)
    probed = probe(so) if probe is not None else None
    checkpoint.finish(so)
    row.log(f"trained to {end}: losses {_fmt(losses)}")
    return losses, start, probed


def setup_only(row: Row, cfg, probe):
    """Bridge's setup (which loads cfg.checkpoint.load / pretrained_checkpoint), ``probe(setup_out)``, no training."""
    from mfsdp_gpu import bridge, checkpoint

    _validated(cfg)
    so = bridge.setup(cfg)
    row.log(f"setup done (iteration {int(so.state.train_state.step)})")
    try:
        return probe(so)
    finally:
        checkpoint.finish(so)


def fixed_tokens():
    import torch

    g = torch.Generator().manual_seed(SEED)
    return torch.randint(0, VOCAB, LOGIT_TOKENS, generator=g)


def megatron_logits(model) -> object:
    import torch

    tokens = fixed_tokens().cuda()
    pos = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0).expand_as(tokens)
    for chunk in model:
        chunk.eval()
    with torch.no_grad():
        out = model[0](input_ids=tokens, position_ids=pos, attention_mask=None)
    return out[..., :VOCAB].float().cpu()


def _probe_logits(so):
    """The live model's logits, or the exception that stopped them (a failed probe must not fail the resume)."""
    try:
        return megatron_logits(so.model)
    except Exception as exc:
        traceback.print_exc()
        return exc


def hf_logits(path: str):
    import torch
    import transformers

    try:
        m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    except TypeError:  # transformers 4.x spells it torch_dtype
        m = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16)
    m = m.cuda().eval()
    with torch.no_grad():
        out = m(input_ids=fixed_tokens().cuda()).logits
    del m
    return out[..., :VOCAB].float().cpu()


def compare_logits(row: Row, ref, got, reference: str = "the Megatron model", compared: str = "transformers") -> None:
    import torch

    diff = (got - ref).abs()
    scale = float(ref.abs().max())
    rel = float(diff.max()) / scale if scale > 0 else math.inf
    row.data.update(
        check=f"logits on fixed tokens (2 x 64): max |{compared} - {reference}| / max |{reference}|",
        difference=rel,
        max_abs_difference=float(diff.max()),
        mean_abs_difference=float(diff.mean()),
        logits_max_abs=scale,
        argmax_agreement=float((got.argmax(-1) == ref.argmax(-1)).float().mean()),
        tolerance=LOGITS_RTOL,
        finite=bool(torch.isfinite(got).all() and torch.isfinite(ref).all()),
    )
    row.data["passed"] = row.data["finite"] and rel <= LOGITS_RTOL and row.data.get("exit") == 0


def compare_resume(row: Row, reference: dict, resumed: dict, first: int) -> None:
    """Losses are keyed by train_state.step as Bridge's on_train_step_end sees it (before the increment:
    the step that starts from ``first`` updates), so a resume from iteration ``first`` logs ``first`` first."""
    if resumed and min(resumed) != first:
        raise RuntimeError(f"the resumed run started at step {min(resumed)}, not at the checkpoint's {first}")
    ref, got = reference.get(first), resumed.get(first)
    if ref is None or got is None:
        raise RuntimeError(f"no loss at iteration {first} (reference {_fmt(reference)}, resumed {_fmt(resumed)})")
    diff = abs(got - ref)
    later = [abs(resumed[i] - reference[i]) for i in sorted(resumed) if i > first and i in reference]
    row.data.update(
        check=f"loss of the first resumed step (iteration {first}) against the uninterrupted run's",
        difference=diff,
        relative_difference=diff / abs(ref) if ref else None,
        tolerance=LOSS_RTOL * abs(ref),
        tolerance_rule=f"|delta| <= {LOSS_RTOL} x |reference loss| (bf16 rtol)",
        reference_losses=reference,
        resumed_losses=resumed,
        optimizer_state="dropped",
        optimizer_drop_cost={
            "what": "|loss difference| at the later resumed steps (fresh Adam moments vs carried ones)",
            "max": max(later) if later else None,
            "mean": sum(later) / len(later) if later else None,
            "steps": len(later),
        },
    )
    row.data["passed"] = math.isfinite(got) and diff <= LOSS_RTOL * abs(ref) and row.data.get("exit") == 0


def _fmt(losses: dict) -> str:
    return ", ".join(f"{k}:{v:.4f}" for k, v in sorted(losses.items()))


def _iter(root: str, i: int) -> str:
    return os.path.join(root, f"iter_{i:07d}")


def worker(kind: str, out: str, work_root: str) -> int:
    import torch

    work = os.path.join(work_root, kind)
    os.makedirs(work, exist_ok=True)
    rows = WORKERS[kind]
    base = dict(model=kind, world_size=1, gpus=1, expert_parallel=1 if kind == "moe" else None)
    from mfsdp_gpu import bridge, report

    bridge.unset_cuda_device_max_connections()  # Megatron FSDP needs it unset or > 1
    meta = {
        "date": report.now_utc(),
        "device": torch.cuda.get_device_name(),
        "versions": dict(report.versions(), transformers=_version("transformers")),
        "K": K,
        "N": N,
        "seq": SEQ,
        "gbs": GBS,
    }
    with open(os.path.join(out, f"meta_{kind}.json"), "w") as fh:
        json.dump(meta, fh, indent=1)
    hf0 = make_hf_model(kind, os.path.join(work, "hf0"))
    ru, a_dst, r1, h_dst, t_dst, r2, d_dst = (
        os.path.join(work, n)
        for n in ("ckpt_distopt", "a_fsdp", "ckpt_fsdp", "b_hf", "c_torch_dist", "ckpt_td", "d_fsdp")
    )
    state: dict = {}

    with Row(out, f"{kind}_U_distopt", **base, role="reference") as row:
        state["U"], _, _ = train_run(row, build_cfg(hf0, DISTOPT, save=ru))
        row.data.update(passed=all(math.isfinite(v) for v in state["U"].values()) and len(state["U"]) == N, exit=0)

    with Row(out, f"{kind}_a_torch_dist_to_fsdp_dtensor", **base, **_ft("a")) as row:
        if run_convert(row, _iter(ru, K), a_dst, "fsdp_dtensor") == 0:
            losses, start, logits = train_run(row, build_cfg(hf0, FSDP, load=a_dst, save=r1), probe=_probe_logits)
            row.data["resumed_from_iteration"] = start
            state["R1"] = losses
            if isinstance(logits, BaseException):  # row b needs them; row a's own check does not
                row.data["logits_probe_error"] = f"{type(logits).__name__}: {logits}"[:2000]
            else:
                state["L_meg"] = logits  # the weights R1 saved at N
            compare_resume(row, state["U"], losses, K)

    with Row(out, f"{kind}_b_fsdp_dtensor_to_hf", **base, **_ft("b")) as row:
        if run_convert(row, _iter(r1, N), h_dst, "hf", hf_config=hf0) == 0:
            if "L_meg" not in state:
                raise RuntimeError("no Megatron FSDP logits from row a's run (see its logits_probe_error)")
            compare_logits(row, state["L_meg"], hf_logits(h_dst), "the live Megatron FSDP model", "transformers")

    if "c" in rows:
        with Row(out, f"{kind}_c_fsdp_dtensor_to_torch_dist", **base, **_ft("c")) as row:
            if run_convert(row, _iter(r1, 2 * K), t_dst, "torch_dist") == 0:
                losses, start, _ = train_run(row, build_cfg(hf0, DISTOPT, load=t_dst, save=r2))
                row.data["resumed_from_iteration"] = start
                compare_resume(row, state.get("R1", {}), losses, 2 * K)

    if "d" in rows:
        with Row(out, f"{kind}_d_hf_to_fsdp_dtensor", **base, **_ft("d")) as row:
            if run_convert(row, hf0, d_dst, "fsdp_dtensor") == 0:
                got = setup_only(
                    row, build_cfg(hf0, FSDP, pretrained=d_dst, iters=2), lambda so: megatron_logits(so.model)
                )
                compare_logits(
                    row,
                    hf_logits(hf0),
                    got,
                    "transformers on the source folder",
                    "Megatron FSDP loaded through checkpoint.pretrained_checkpoint",
                )
                ft, _, _ = train_run(row, build_cfg(hf0, FSDP, pretrained=d_dst, iters=2))
                row.data["finetune_losses"] = ft
                row.data["passed"] = row.data["passed"] and len(ft) == 2 and all(math.isfinite(v) for v in ft.values())

    if "upstream" in rows:
        # Bridge 0.6.2 also initialises a run from a Hugging Face folder directly (checkpoint.pretrained_checkpoint
        # -> _load_hf_pretrained_checkpoint): no conversion at all for starting a fine-tune.
        up = dict(base, via="upstream")
        with Row(
            out, "dense_upstream_pretrained_checkpoint_hf_into_fsdp", **up, **{"from": "hf", "to": "fsdp_dtensor"}
        ) as row:
            row.data["command"] = f"checkpoint.pretrained_checkpoint={hf0} under Megatron FSDP optim_grads_params"
            got = setup_only(row, build_cfg(hf0, FSDP, pretrained=hf0, iters=2), lambda so: megatron_logits(so.model))
            row.data["exit"] = 0
            compare_logits(row, hf_logits(hf0), got, "transformers", "Megatron FSDP initialised from the folder")
        upstream_rows(out, work, base, hf0, ru, r1)
    return 0


def _ft(key: str) -> dict:
    src, dst = ROW_NAMES[key]
    return {"from": src, "to": dst, "via": "convert"}


def upstream_rows(out, work, base, hf0, ru, r1) -> None:
    """The conversion paths the installed Bridge offers itself, and the repositories' converters' presence."""
    import importlib.util

    import torch.distributed as dist
    from megatron.core import parallel_state

    # AutoBridge.export_ckpt / import_ckpt open their own single-process group (temporary_distributed_context):
    # give them a clean process.
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
    # temporary_distributed_context reuses MASTER_ADDR/PORT when set; a fresh free port avoids the old store's
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(var, None)
    up = dict(base, via="upstream")

    with Row(out, "dense_upstream_export_ckpt_torch_dist_to_hf", **up, **{"from": "torch_dist", "to": "hf"}) as row:
        row.data["command"] = f"AutoBridge.from_hf_pretrained({hf0!r}).export_ckpt({ru!r}, ...)"
        from megatron.bridge import AutoBridge

        dst = os.path.join(work, "up_export_td_hf")
        AutoBridge.from_hf_pretrained(hf0).export_ckpt(ru, dst, show_progress=False)
        row.data["exit"] = 0
        row.data["check"] = "exported folder is hf by the ckpt reader"
        row.data["passed"] = _ckpt_format(dst) == "hf"

    with Row(out, "dense_upstream_export_ckpt_fsdp_dtensor_to_hf", **up, **{"from": "fsdp_dtensor", "to": "hf"}) as row:
        row.data["command"] = f"AutoBridge.from_hf_pretrained({hf0!r}).export_ckpt({r1!r}, ...)"
        from megatron.bridge import AutoBridge

        dst = os.path.join(work, "up_export_fsdp_hf")
        try:
            AutoBridge.from_hf_pretrained(hf0).export_ckpt(r1, dst, show_progress=False)
            row.data["exit"] = 0
            row.data["passed"] = _ckpt_format(dst) == "hf"
        finally:
            _cleanup_world()

    with Row(out, "dense_upstream_import_ckpt_hf_to_torch_dist", **up, **{"from": "hf", "to": "torch_dist"}) as row:
        row.data["command"] = f"AutoBridge.import_ckpt({hf0!r}, ...)"
        from megatron.bridge import AutoBridge

        dst = os.path.join(work, "up_import_hf_td")
        try:
            AutoBridge.import_ckpt(hf0, dst)
            row.data["exit"] = 0
            row.data["check"] = "imported folder is torch_dist by the ckpt reader"
            row.data["passed"] = _ckpt_format(dst) == "torch_dist"
        finally:
            _cleanup_world()

    with Row(out, "dense_upstream_repository_converters", **up, **{"from": "-", "to": "-"}) as row:
        spec = importlib.util.find_spec("megatron.bridge")
        pkg = os.path.dirname(os.path.dirname(spec.origin)) if spec and spec.origin else None  # .../megatron
        site = os.path.dirname(pkg) if pkg else None
        roots = [r for r in (pkg, site and os.path.join(site, "examples"), site and os.path.join(site, "tools")) if r]
        found: dict[str, list[str]] = {n: [] for n in REPOSITORY_CONVERTERS}
        for root in roots:
            for dirpath, _, files in os.walk(root):
                for name in REPOSITORY_CONVERTERS:
                    if name in files:
                        found[name].append(os.path.join(dirpath, name))
        row.data.update(
            command="look for the repositories' converters under the installed megatron package (and "
            "site-packages/examples, site-packages/tools)",
            exit=0,
            check="converter file present in the installed packages",
            found=found,
            searched=roots,
            passed=all(found.values()),
            note="examples/conversion/mfsdp/ (Megatron-Bridge) and tools/checkpoint/ (Megatron-LM) are repository "
            "folders; a converter that is not installed cannot be run from a pip install",
        )


def _cleanup_world() -> None:
    import torch.distributed as dist

    with contextlib.suppress(Exception):
        from megatron.core import parallel_state

        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
    with contextlib.suppress(Exception):
        if dist.is_initialized():
            dist.destroy_process_group()


def _ckpt_format(path: str) -> str | None:
    from mfsdp_lib.runs import checkpoints

    try:
        return checkpoints.inspect(path).format
    except Exception:
        return None


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for RAW/<row>.json, RAW/<row>.log and the workers' logs")
    ap.add_argument(
        "--work",
        default=os.path.join(tempfile.gettempdir(), "mfsdp-ckpt-migration-work"),
        help="folder for the models and checkpoints the runs write (kept out of --out: only evidence goes there)",
    )
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="kill the workers after this many s")
    ap.add_argument("--only", action="append", choices=sorted(WORKERS), help="run only this model's worker")
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        import torch  # before transformer_engine: torch preloads the NCCL library TE needs

        if not torch.cuda.is_available():
            print("bench_ckpt_migration: needs a CUDA GPU", file=sys.stderr)
            return 2
        return worker(args.worker, os.path.abspath(args.out), os.path.abspath(args.work))
    return launch(os.path.abspath(args.out), args.budget_s, args.only or sorted(WORKERS), os.path.abspath(args.work))


if __name__ == "__main__":
    sys.exit(main())
