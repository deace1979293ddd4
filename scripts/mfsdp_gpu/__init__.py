"""The GPU side of the skill: what ``scripts/rehearse_train.py`` and ``scripts/smoke_train.py`` run.

Both entry points are thin scripts over this package; they run on a GPU machine with real
Megatron-Bridge, started as subprocesses by ``mfsdp.py rehearse`` / ``mfsdp.py smoke`` and by the
benchmarks. One module per concern:

* ``args``        the command lines (parsers, argument checks, ``KEY=VALUE`` overrides); pure Python
* ``presets``     the built-in model shapes and the meta-device decision; pure Python
* ``bridge``      Megatron-Bridge set-up: strategy settings, config containers from a preset, a YAML or
                  a recipe, dotted get/set with the record of every change, Bridge's validate and setup
* ``fakeworld``   one GPU as rank R of a world of N: the fake process group, the settings it needs, the
                  lowest-rank checkpoint planner, the FP8 weight scales an amax all-reduce would give, the
                  process groups a rank holds
* ``collectives`` where ``torch.distributed`` collectives are patched (mirror collectives, and the
                  recorder of every collective for ``rehearse --perf``)
* ``steps``       step timing and per-step memory (Bridge's train-step callbacks, the optimizer step;
                  CUDA-event timing of the steps after warm-up for ``--perf``)
* ``kernel_profile`` ``--perf --profile``: the timed steps' GPU kernels summed by name and by kind
* ``perf``        the ``--perf`` record (step shape, Bridge's model FLOPs, groups, the collective log)
                  and the GPU lock that lets several rehearsals share one GPU
* ``hfhub``       Hugging Face configs for recipes, offline (``--hf-config``), a missing one named at once
* ``measure``     CUDA memory per phase, NVML, parameter and optimizer-state counts
* ``checkpoint``  save/load helpers: forward-only loss, the round-trip verdict, checkpoint listings
* ``mamba``       hybrid (Mamba) models: preparing mamba-ssm before megatron, labelled deviations
* ``report``      the JSON records (``rehearse-run/1``, the smoke rank records), progress, versions, failures
* ``workload``    which forward step and mock data a model trains with: Bridge's GPT step, or Wan's
                  flow-matching step on Bridge's Wan mock data
* ``phases``      Bridge's ``setup()`` timed and measured phase by phase
* ``rehearse``    one rehearsal run (``rehearse_train.py``); ``parity`` its DDP-vs-FSDP mode
* ``smoke``       one smoke / strategy-benchmark rank (``smoke_train.py``)
* ``ckpt_convert`` the torch side of ``mfsdp.py convert`` (torch_dist, fsdp_dtensor, hf at world size 1)

torch and megatron are imported only inside functions, so ``--help`` and the CPU tests work without
them, on Python 3.10 too.
"""
