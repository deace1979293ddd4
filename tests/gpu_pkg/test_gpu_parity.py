"""``rehearse_train.py --parity`` (``mfsdp_gpu.parity``): the legs' arguments and a verdict when they fail."""

from __future__ import annotations

import json

from mfsdp_gpu import args, parity


def _parse(*argv):
    return args.rehearse_parser().parse_intermixed_args(list(argv))


def test_parity_legs_drop_the_flags_they_set_themselves():
    argv = [
        "--model-preset",
        "llama-1b",
        "--parity",
        "--save-load",
        "--iters",
        "5",
        "--out",
        "o",
        "--strategy=ddp",
        "x.y=1",
    ]
    drop = {"--parity", "--strategy", "--out", "--fake-pg", "--no-fake-pg", "--world-size", "--rank"}
    assert parity.strip_args(argv, drop) == ["--model-preset", "llama-1b", "--save-load", "--iters", "5", "x.y=1"]


def test_parity_reports_failed_legs_without_crashing(tmp_path):
    # Here the legs refuse (no torch/GPU): the parity verdict must say so, not raise.
    argv = ["--model-preset", "tiny", "--parity", "--iters", "2", "--out", str(tmp_path / "p")]
    a = _parse(*argv)
    assert parity.run_parity(a, argv) == 1
    rep = json.loads((tmp_path / "p" / "report.json").read_text())
    assert rep["result"] == "failed" and rep["first_failure"]["type"] == "LegFailed"
    assert set(rep["legs"]) == {"ddp", "fsdp"}
    for leg in rep["legs"].values():
        assert leg["exit_code"] != 0 and "--no-fake-pg" in leg["command"]
    assert rep["parity"]["passed"] is False and rep["parity"]["steps_compared"] == 0
    assert "--strategy" in rep["legs"]["fsdp"]["command"] and "optim_grads_params" in rep["legs"]["fsdp"]["command"]
