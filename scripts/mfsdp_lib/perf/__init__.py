"""Performance of a Megatron-Bridge job, predicted from one GPU: what each part answers.

``rehearse --perf`` runs the job's real model at its real per-rank shapes as rank R of a
world of N on one GPU (PyTorch's fake process-group backend: collectives move nothing).
Per rank, a data-parallel job computes the same at N = 1 and N = 64, so the step time
measured there is the job's compute time; what the fake backend hides is communication.
The engine records every collective the rank issues (its kind, its message size, the
ranks of its group, the phase it ran in); this package turns that record into a
prediction, with the standard library only:

* :mod:`.collectives`: aggregate the record into bytes per step, per kind and per parallel
  group (dp, dp_outer, tp, cp, ep, pp, ...), named by the group's ranks;
* :mod:`.volumes`: the analytic per-step volume of each data-parallel strategy (DDP,
  distributed optimizer, Megatron FSDP's four strategies), as formulas with their source;
* :mod:`.predict`: a link model (NVLink within a node, InfiniBand across) that costs each
  group's traffic and bounds the step time from both sides (perfect overlap, no overlap);
* :mod:`.flops`: dense peak throughput per GPU and precision, for MFU;
* :mod:`.report`: one rehearsal's perf summary and the ``--compare`` table.

The model FLOPs per step are not computed here: the engine calls Bridge's own formula
(``megatron/bridge/training/utils/flop_utils.py`` :: ``num_floating_point_operations``,
what Bridge logs as ``MODEL_TFLOP/s/GPU``) on the job's config and records the value.
"""
