"""Bridge's ``setup()`` timed and measured phase by phase, for the rehearsal report.

Module-level functions that ``setup()`` calls are wrapped for the duration of the call (``Patches``):
each wrapper ends the running phase (recording memory after it and its peak) and begins the next.
"""

from __future__ import annotations

import time

from . import bridge
from .measure import Mem
from .report import Report
from .steps import StepMeter


class Patches:
    """Module-level wrappers that time and measure Bridge's setup phases; undone at exit."""

    def __init__(self):
        self.undo = []

    def wrap(self, module, attr: str, before, after):
        orig = getattr(module, attr, None)
        if orig is None:
            return False

        def wrapper(*args, **kwargs):
            before()
            out = orig(*args, **kwargs)
            after(out)
            return out

        setattr(module, attr, wrapper)
        self.undo.append((module, attr, orig))
        return True

    def restore(self):
        for module, attr, orig in reversed(self.undo):
            setattr(module, attr, orig)
        self.undo = []


def setup_measured(cfg, report: Report, mem: Mem, clock=None):
    """Bridge's setup(), with each of its phases timed and measured.

    Module-level functions that setup() calls are wrapped for the duration of the call:
    each wrapper ends the running phase (recording memory after it and its peak) and
    begins the next. Phases: setup_start (config logging, experimental flags),
    initialize (process groups), tokenizer, model_build (modules built, before the
    data-parallel wrap: unsharded weights, or none on the meta device), model_wrap
    (DDP / Megatron FSDP wrap: buffers and shards), optimizer, data (checkpoint load
    if any, data iterators).
    """
    import megatron.bridge.training.setup as setup_mod

    patches = Patches()
    t_setup = time.perf_counter()

    def end_running():
        cur = report.phase
        if cur and report.data["phases"].get(cur, {}).get("status") == "running":
            report.end(cur, **mem.snap())

    def begin(name):
        def before():
            end_running()
            report.begin(name)

        return before

    def then(name=None):
        def after(_out=None):
            end_running()
            if name:
                report.begin(name)

        return after

    patches.wrap(setup_mod, "initialize_megatron", begin("initialize"), then("tokenizer"))
    patches.wrap(setup_mod, "_build_distributed_model", begin("model_build"), then(None))
    wrap_measured = False
    for mod_name in ("megatron.bridge.models.model_provider", "megatron.training.models.dist_utils"):
        try:
            import importlib

            mod = importlib.import_module(mod_name)
        except Exception:  # an optional measurement point; its absence must not stop setup
            continue
        wrap_measured |= patches.wrap(mod, "_ddp_wrap", begin("model_wrap"), lambda _o=None: None)
    patches.wrap(setup_mod, "setup_optimizer", begin("optimizer"), then("data"))
    if cfg.peft is not None:
        orig = setup_mod._create_peft_pre_wrap_hook
        setup_mod._create_peft_pre_wrap_hook = bridge.peft_hook_without_checkpoint()
        patches.undo.append((setup_mod, "_create_peft_pre_wrap_hook", orig))
        report.data["peft_base_weights"] = bridge.PEFT_BASE_WEIGHTS
    report.data["model_wrap_measured_separately"] = wrap_measured

    meter = StepMeter(report, mem, clock)
    manager = bridge.callback_manager(meter)
    mem.reset()
    report.begin("setup_start")
    try:
        so = bridge.setup(cfg, manager)
    finally:
        patches.restore()
    end_running()
    report.data["setup_wall_s"] = round(time.perf_counter() - t_setup, 3)
    report.write()
    return so, manager, meter
