"""``mfsdp.py enable``: apply the Megatron FSDP overrides and say what changed.

Glue over ``enable.plan`` (what to change and why), ``enable.yaml_edit`` (edit the
user's YAML in place, keeping comments and key order) and ``rules.evaluate`` (the
result is checked before it is written: what we emit passes ``check``).

Output goes to stdout unless ``-o OUT`` (written atomically; an existing OUT needs
``--force`` and is backed up) or ``--in-place`` (CONFIG itself, backed up first).
The report of changes goes to stderr when the result is on stdout, so
``mfsdp.py enable --emit overrides > fsdp.args`` captures only the overrides.

Live mode (``--recipe NAME``) needs an importable Megatron-Bridge (an NVIDIA
container): it builds the real recipe, applies the same overrides to the real
``ConfigContainer``, runs the real ``runtime_config_update()`` (which ends in
``validate()``) and reports any disagreement with our rule table. Both judge the same
world (``live_world``: --gpus, else a launcher's WORLD_SIZE, else the smallest the layout
allows). Importability is detected from the installed distribution's metadata,
without importing anything, so the offline path stays fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

from .. import config_io, enable, rules, what_works
from ..cli.check import add_base_argument, add_env_arguments, allow_intermixed, gpu_count, job_env, split_items
from ..findings import Finding, has_errors, render_text, sort_findings

DESCRIPTION = """\
Apply the Megatron FSDP overrides to a Megatron-Bridge config and say what changed.

Sets dist/ddp.use_megatron_fsdp, the sharding strategy, average_in_collective=false and
ckpt_format=fsdp_dtensor, plus what follows from the config: --save-dir, settings Bridge
rejects with Megatron FSDP, and settings that only fail when the model is wrapped where the
fix is safe (double buffering with the MoE A2A overlap, grouped expert weights, the CUDA-graph
mode of Megatron FSDP, meta-device init with no_shard or PEFT). Every real change is listed
with its old value and why; nothing that is already right is listed.

checkpoint.load and checkpoint.pretrained_checkpoint are kept (clearing load would silently
turn auto-resume off); when load may hold checkpoints of the old format, enable says how to
tell ('mfsdp.py ckpt') and what to do (convert, or a fresh directory).

enable never emits a config that cannot start. When an error remains that needs a decision
(pipeline parallelism, an optimizer other than Adam/SGD, offloading, a PEFT base checkpoint
...), it writes nothing, lists the errors with their fixes, and exits 1. Pipeline parallelism
(PP > 1) cannot run with Megatron FSDP (its device mesh has no pipeline axis): choose
--set-pp-1 to set PP=1 (more TP or data parallelism absorbs the stages; check memory with
'mfsdp.py memory'), or keep the distributed optimizer without Megatron FSDP.

Batch sizes follow the world size: data parallelism is DP = GPUs / (TP x PP x CP), as Bridge
computes it, so PP=1 on the same GPUs multiplies DP, and train.global_batch_size (and the eval
batch, which defaults to it) must stay a multiple of micro_batch_size x DP, or the job cannot
start. A config file does not say how many GPUs the job has: give it with --gpus N. Without it,
enable judges at the smallest world the config's layout allows (a batch that does not divide
there divides at no world the job can use) and says so. When a batch does not divide, enable
refuses and names the field, the numbers and the nearest valid values: pass your choice as
KEY=VALUE (e.g. train.global_batch_size=64), or --fit-eval-batch to let enable set
validation.eval_global_batch_size to the nearest valid value (validation.eval_iters scaled to
keep the samples evaluated; both listed as changes). The training batch is never changed
without your KEY=VALUE: it changes the optimisation.

The result is checked with the same rule table as 'mfsdp.py check'.

CONFIG is a run_config.yaml, a partial override file, or nothing (the embedded Llama 3
8B recipe). A partial file (without every section a ConfigContainer needs) is planned over
the recipe a launcher merges it over: the embedded Llama 3 8B recipe unless --base names
your recipe's run_config.yaml (or 'defaults': the file alone), exactly as 'check' judges it.
KEY=VALUE overrides are applied first, like Bridge's launchers do."""

EPILOG = """\
examples:
  mfsdp.py enable --emit overrides --save-dir /results/ckpt
        # Hydra lines for a Bridge launcher: dist.use_megatron_fsdp=true ...
  mfsdp.py enable run_config.yaml -o fsdp_run_config.yaml
        # full YAML, edited in place (comments and key order kept), written atomically
  mfsdp.py enable my_overrides.yaml --in-place   # rewrites it, keeping my_overrides.yaml.bak
  mfsdp.py enable my_overrides.yaml --base embedded -o fsdp_overrides.yaml
        # a partial --config-file for the recipe launcher: adds what the recipe needs too
  mfsdp.py enable --emit python                  # cfg.ddp.use_megatron_fsdp = True ...
  mfsdp.py enable --strategy optim_grads --perf --emit json
  mfsdp.py enable --recipe llama3_8b_pretrain_config   # live: real recipe + real validate()
        # Llama recipes read the model config from the Hugging Face hub (offline: HF_HUB_OFFLINE=1
        # with it cached); vanilla_gpt_pretrain_config builds offline but needs the model shape:
  mfsdp.py enable --recipe vanilla_gpt_pretrain_config model.num_layers=2 model.hidden_size=256 model.num_attention_heads=4
  mfsdp.py enable --recipe vanilla_gpt_pretrain_config ... --gpus 64
        # our rules and Bridge both judge 64 GPUs (without --gpus: WORLD_SIZE when a launcher set it)

  mfsdp.py enable pp4_recipe.yaml --set-pp-1 -o fsdp.yaml   # PP 4 -> 1, said in the change list
  mfsdp.py enable pp4_recipe.yaml --set-pp-1 --gpus 64 -o fsdp.yaml
        # the job's 64 GPUs: DP = 64 / (TP x CP); batch sizes checked at that DP
  mfsdp.py enable pp4_recipe.yaml --set-pp-1 --gpus 64 train.global_batch_size=128 --fit-eval-batch
        # the training batch you chose; the eval batch moved to the nearest valid value

exit codes: 0 result passes check (written / printed), 1 refused: errors remain that need a
decision (listed; nothing written), 2 unusable input (or --recipe where Megatron-Bridge is
not installed)."""


def configure(parser) -> None:
    parser.add_argument(
        "items",
        nargs="*",
        metavar="[CONFIG] [KEY=VALUE ...]",
        help="optional config file, then section.key=value overrides applied first",
    )
    parser.add_argument(
        "--emit",
        choices=("yaml", "python", "overrides", "json"),
        default="yaml",
        help="yaml: the full config; python: cfg.x.y = v lines; overrides: section.key=value "
        "lines; json: changes + findings (default yaml)",
    )
    parser.add_argument("-o", "--output", metavar="OUT", help="write the result to OUT atomically")
    parser.add_argument("--force", action="store_true", help="allow -o to replace an existing OUT (kept as OUT.bak)")
    parser.add_argument("--in-place", action="store_true", help="rewrite CONFIG itself (kept as CONFIG.bak)")
    parser.add_argument("--save-dir", metavar="DIR", help="set checkpoint.save to DIR")
    parser.add_argument(
        "--strategy",
        choices=enable.STRATEGIES,
        default="optim_grads_params",
        help="data_parallel_sharding_strategy (default optim_grads_params: shard everything)",
    )
    parser.add_argument(
        "--perf",
        action="store_true",
        help="also build the model on the meta device, as Bridge's FSDP perf recipes do (not with no_shard or "
        "PEFT); the memory-for-speed knobs (double buffer, unit size, nccl_ub) are yours to measure: "
        "references/tuning.md",
    )
    parser.add_argument(
        "--set-pp-1",
        dest="set_pp1",
        action="store_true",
        help="set model.pipeline_model_parallel_size=1 (and drop pipeline-only layout keys) instead of "
        "refusing a PP > 1 config; each GPU then holds every layer's shard",
    )
    parser.add_argument(
        "--gpus",
        type=gpu_count,
        metavar="N",
        help="the job's world size (number of GPUs): the batch sizes are checked against micro-batch x DP "
        "with DP = N / (TP x PP x CP), as Bridge computes it (default: the smallest world the config's layout "
        "allows, where a batch that does not divide divides at no world)",
    )
    parser.add_argument(
        "--fit-eval-batch",
        action="store_true",
        help="when validation.eval_global_batch_size is not a multiple of eval micro-batch x DP, set it to the "
        "nearest one and scale validation.eval_iters to keep the samples evaluated (listed as changes)",
    )
    add_env_arguments(parser)
    parser.add_argument(
        "--recipe", metavar="NAME", help="live mode: build Bridge's recipe NAME (needs megatron-bridge installed)"
    )
    add_base_argument(parser)
    allow_intermixed(parser)


def _bridge_installed() -> str | None:
    """Installed megatron-bridge version, from metadata only (no import), and only from the interpreter's real
    environment: never a *.egg-info or a megatron/ package planted in the skill folder (sources.environment_paths)."""
    from ..integrity import installed

    dist = installed.installed_distribution("megatron-bridge")
    if dist is None or not installed.module_outside_skill("megatron"):
        return None
    return dist.version


def _report(changes, out) -> None:
    if not changes:
        out.write("no changes: Megatron FSDP is already enabled as required\n")
        return
    out.write(f"{len(changes)} change(s):\n")
    for c in changes:
        out.write(f"  {c.path}: {rules.fmt(c.old)} -> {rules.fmt(c.new)}\n      why: {c.why}\n")


def _plan(eff, args, env) -> list:
    """``enable.plan`` with the command line's decisions (file mode and live mode take the same ones)."""
    return enable.plan(
        eff,
        strategy=args.strategy,
        save_dir=args.save_dir,
        perf=args.perf,
        env=env,
        set_pp1=args.set_pp1,
        gpus=args.gpus,
        fit_eval_batch=args.fit_eval_batch,
    )


def _refuse(changes, findings, blockers, out, world=None) -> None:
    """No config is emitted: say why, what would have changed, and what to decide."""
    out.write(
        f"enable refused: {len(blockers)} error(s) remain that need your decision; nothing was written. "
        "Fix them (or pass the choice on the command line as KEY=VALUE) and run enable again.\n"
    )
    if any(f.rule == "MFSDP-PIPELINE-PARALLEL" for f in blockers):
        out.write(
            "  pipeline parallelism: pass --set-pp-1 to set model.pipeline_model_parallel_size=1 "
            "(then check memory with 'mfsdp.py memory'), or keep the distributed optimizer without Megatron FSDP\n"
        )
    batch = sorted({f.rule for f in blockers} & {"MFSDP-TRAIN-BATCH-DP", "MFSDP-EVAL-BATCH-DP"})
    if batch and world is not None:
        size, how = world
        out.write(
            f"  batch sizes ({', '.join(batch)}): judged at {size} GPUs ({how}). Data parallelism is "
            "world / (TP x PP x CP), so the world size decides: give the job's GPU count with --gpus N; "
            "choose the batch sizes yourself as KEY=VALUE (the fixes below name the nearest valid values); "
            "or, for evaluation only, --fit-eval-batch sets validation.eval_global_batch_size to the nearest "
            "valid value and scales validation.eval_iters\n"
        )
    render_text([f for f in findings if f.severity != "info"], header="check of the result:", out=out)
    if changes:
        out.write("what enable would have changed:\n")
        _report(changes, out)


def run(args) -> int:
    if args.recipe:
        return _run_live(args)
    path, overrides = split_items(args.items)
    if args.in_place and path is None:
        raise config_io.input_error("--in-place needs a CONFIG file to rewrite")
    if args.in_place and args.output:
        raise config_io.input_error("use either --in-place or -o OUT, not both")
    if args.in_place and args.emit != "yaml":  # CONFIG is YAML: never replace it with Python or override lines
        raise config_io.input_error(
            f"--in-place rewrites CONFIG as YAML; drop --emit {args.emit}, or write it with -o OUT"
        )
    if (
        args.output
        and os.path.exists(args.output)
        and not args.force
        and not (path and os.path.abspath(args.output) == os.path.abspath(path) and args.in_place)
    ):
        raise config_io.input_error(
            f"{args.output} exists; pass --force to replace it (a backup is kept), or choose another -o"
        )

    if path:
        path = config_io.resolve_config_path(path)
    # --in-place is a read-modify-write: hold the folder lock until run() returns, so concurrent runs serialise.
    _lock = config_io.edit_lock(path) if args.in_place and path else None  # noqa: F841 (held, not used)
    data, name = config_io.load_file_data(path)
    text = config_io.read_text(path) if path else open(config_io.EMBEDDED_DEFAULT, encoding="utf-8").read()
    env = job_env(args)

    # The user's KEY=VALUE overrides are changes too (they must appear in the emitted config).
    # A partial CONFIG is planned over the recipe it will be merged over, as check judges it (choose_base).
    chosen_base = config_io.choose_base(args.base, data)
    base_info, base_note = config_io.base_summary(args.base, data, os.path.basename(name) if path else name)
    base = config_io.merge_file(config_io.base_config(chosen_base), data, name)
    user_changes = []
    eff = enable._deep_copy(base)
    for item in overrides:
        p, v = config_io.parse_override(item)
        old = config_io.get(eff, p, enable.S.default(p))
        config_io.set_path(eff, p, v, "override")
        user_changes.append(enable.Change(p, old, config_io.get(eff, p), "given on the command line"))

    changes = user_changes + _plan(eff, args, env)
    changes = [c for c in changes if not enable._same(c.old, c.new)]
    result = enable.apply(base, changes)
    # the world: --gpus, else the smallest that both the config as given (with the user's KEY=VALUE) and the result fit
    world = enable.job_world(eff, result, args.gpus)
    notes = enable.advice(base, changes, args.gpus, world)
    findings = rules.evaluate(result, env, None, *world)
    ok = not has_errors(findings)

    in_place_edit = True
    if args.emit == "yaml":
        body, in_place_edit = enable.yaml_edit(text, data, changes)
        # the written text, re-read through the loader, must give the same verdict
        reread = config_io.merge_file(
            config_io.base_config(chosen_base), config_io.parse_yaml(body, "result"), "result"
        )
        findings = rules.evaluate(reread, env, None, *world)
        ok = not has_errors(findings)
    elif args.emit == "python":
        body = enable.render_python(changes)
    elif args.emit == "overrides":
        body = enable.render_overrides(changes)
    else:
        body = (
            json.dumps(
                {
                    "ok": ok,
                    "config": name,
                    "strategy": args.strategy,
                    "changes": [c.to_dict() for c in changes],
                    "overrides": enable.overrides_of(changes),
                    "findings": [f.to_dict() for f in sort_findings(findings)],
                    "refused": not ok,
                    "notes": notes,
                    "world": {"size": world[0], "given": args.gpus is not None, "how": world[1]},
                    "base": base_info,
                },
                indent=2,
            )
            + "\n"
        )

    blockers = enable.blocking(findings)
    if blockers and args.emit != "json":
        _refuse(changes, findings, blockers, sys.stderr, world)
        if base_note:
            sys.stderr.write(f"note: {base_note}\n")
        return 1
    target = path if args.in_place else args.output
    if args.in_place and body == text:  # nothing to change: no rewrite, no backup piling up per run
        report = sys.stdout
        report.write(f"{target} left as it was (nothing to change)\n")
    elif target:
        bak = config_io.write_atomic(
            target,
            body,
            backup=bool(args.in_place or os.path.lexists(target)),
            expect_text=text if args.in_place else None,
        )
        report = sys.stdout
        report.write(f"wrote {target}" + (f" (backup: {bak})" if bak else "") + "\n")
    else:
        sys.stdout.write(body)
        report = sys.stderr
    if args.emit != "json":
        _report(changes, report)
        if not in_place_edit:
            report.write("note: the file could not be edited line by line; it was re-dumped (comments dropped)\n")
        for n in ([base_note] if base_note else []) + notes:
            report.write(f"note: {n}\n")
        notable = [f for f in findings if f.severity != "info"]
        if notable:  # warnings worth knowing (errors refuse above)
            render_text(notable, header="check of the result:", out=report)
        if env.get(rules.MAX_CONN) == "1":
            report.write(f"note: the job environment sets {rules.MAX_CONN}=1; unset it (or set 32) before launching\n")
    what_works.show(eff, "json" if args.emit == "json" else "text", out=report)
    return 0 if ok else 1


# --------------------------------------------------------------------------- live mode


def _find_recipe(name: str):
    import importlib

    recipes = importlib.import_module("megatron.bridge.recipes")
    fn = getattr(recipes, name, None)
    if fn is None:
        for sub in ("llama", "qwen", "deepseek", "gemma", "nemotronh", "gpt"):
            try:
                mod = importlib.import_module(f"megatron.bridge.recipes.{sub}")
            except Exception:
                continue
            fn = getattr(mod, name, None)
            if fn is not None:
                break
    if fn is None or not callable(fn):
        raise config_io.input_error(f"--recipe {name}: no such recipe function in megatron.bridge.recipes")
    return fn


def _call_recipe(name: str, fn):
    """Build the recipe; a failure is one line and exit 2, not an "internal error".

    A recipe can fail for the environment's reasons, not the skill's: the Llama recipes
    read the model's config from the Hugging Face hub, and on the offline H200 (2026-12-02)
    ``llama3_8b_pretrain_config`` raised ``ValueError: Failed to load configuration from
    meta-llama/Meta-Llama-3-8B after 4 attempts`` with HF_HUB_OFFLINE=1, and kept retrying
    past 45 s without it. Bridge's first line names the cause, so it is what we print.
    """
    try:
        return fn()
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise config_io.input_error(
            f"--recipe {name}: building the recipe raised {type(exc).__name__}: {first}"
        ) from None


def _run_live(args) -> int:
    if args.items and "=" not in args.items[0]:
        raise config_io.input_error(
            f"--recipe builds the config itself; give KEY=VALUE overrides, not CONFIG ({args.items[0]})"
        )
    for flag in ("in_place", "output"):
        if getattr(args, flag):
            raise config_io.input_error(
                "--recipe prints the overrides and the live verdict; -o/--in-place do not apply"
            )
    version = _bridge_installed()
    if version is None:
        raise config_io.input_error(
            "--recipe needs Megatron-Bridge installed (an NVIDIA NeMo container); "
            "it is not, so use CONFIG/--emit offline instead"
        )
    path, overrides = split_items(args.items)
    if path is not None:
        raise config_io.input_error(f"--recipe builds the config itself; give KEY=VALUE overrides, not CONFIG ({path})")
    env = job_env(args)
    # stdout is for the overrides alone. Megatron's log handler (megatron/training/log_handler.py)
    # binds sys.stdout when megatron.training is imported, and Bridge prints with print_rank_0, so
    # on the H200 `--recipe NAME > fsdp.args` captured INFO lines too. Importing, building and
    # validating with sys.stdout pointed at stderr binds that handler to stderr instead.
    with contextlib.redirect_stdout(sys.stderr):
        changes, ours, bridge_error = _live_verdicts(args, version, overrides, env)
    findings = list(ours)
    if bridge_error and not has_errors(ours):
        findings.append(
            Finding(
                "MFSDP-LIVE-DISAGREE",
                "error",
                "config",
                f"Bridge {version} runtime_config_update() raised {bridge_error}; our rules, "
                "which cover the Megatron FSDP settings, found no error.",
                "fix what Bridge names; if it is a Megatron FSDP setting, our rule table lacks it: "
                "report it to the skill's maintainers",
            )
        )
    elif not bridge_error and has_errors(ours):
        findings.append(
            Finding(
                "MFSDP-LIVE-DISAGREE",
                "warning",
                "config",
                f"our rules report errors that Bridge {version} validate() accepted.",
                "check the listed errors; runtime-stage rules fail after validate()",
            )
        )
    if not enable.blocking(findings) and not bridge_error:
        sys.stdout.write(enable.render_overrides(changes))  # only a config that can start
    _report(changes, sys.stderr)
    verdict = f"raised {bridge_error}" if bridge_error else "accepted"
    sys.stderr.write(f"Bridge {version} runtime_config_update() (ends in validate()): {verdict}\n")
    render_text(findings, header=f"live check of {args.recipe} with megatron-bridge {version}:", out=sys.stderr)
    return 1 if has_errors(findings) or bridge_error else 0


def live_world(given, result, gpus: int | None, launcher_world: str | None) -> tuple[int, str]:
    """The one world that both our rules and Bridge judge a live recipe at.

    Without a process group Bridge reads the world size from the WORLD_SIZE variable (1 when
    unset), and our batch rules need one too; judged at two different worlds they could disagree
    on the same config. So: ``--gpus`` when given; else a WORLD_SIZE the caller's launcher set
    (torchrun, SLURM wrappers), which is the job's; else the smallest world the layout allows.
    """
    if gpus is not None or launcher_world is None:
        return enable.job_world(given, result, gpus)
    try:
        world = int(launcher_world)
    except ValueError:
        world = 0
    if world < 1:
        raise config_io.input_error(
            f"WORLD_SIZE={launcher_world!r} in the environment is not a positive whole number; "
            "unset it or give the job's GPU count with --gpus N"
        )
    return world, "from WORLD_SIZE in the environment (the launcher's); --gpus N overrides it"


def _live_verdicts(args, version, overrides, env):
    """Real recipe + our plan applied to it; (changes, our findings, Bridge's error or None)."""
    try:
        import tempfile

        from megatron.bridge.training.config import runtime_config_update
    except Exception as exc:  # installed but not importable (no CUDA / TE)
        raise config_io.input_error(
            f"--recipe: megatron-bridge {version} is installed but cannot be imported: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from None
    cfg_obj = _call_recipe(args.recipe, _find_recipe(args.recipe))
    user = {}
    for item in overrides:
        p, v = config_io.parse_override(item)
        user[p] = v
    enable.apply_to_object(cfg_obj, user)
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "recipe.yaml")
        cfg_obj.to_yaml(dump)
        eff = config_io.load_effective(dump)
    changes = _plan(eff, args, env)
    enable.apply_to_object(cfg_obj, enable.overrides_of(changes))
    result = enable.apply(eff, changes)
    saved = os.environ.get("WORLD_SIZE")
    world = live_world(eff, result, args.gpus, saved)
    ours = rules.evaluate(result, env, None, *world)
    bridge_error = None
    os.environ["WORLD_SIZE"] = str(world[0])
    try:
        # The real path a training job takes: env_vars with setdefault, mixed precision, DP size, validate().
        runtime_config_update(cfg_obj)
    except Exception as exc:
        bridge_error = f"{type(exc).__name__}: {exc}"
    finally:
        if saved is None:
            os.environ.pop("WORLD_SIZE", None)
        else:
            os.environ["WORLD_SIZE"] = saved
    return changes, ours, bridge_error
