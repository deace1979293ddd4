"""Property tests: random configs, overrides, environments and bytes never give a traceback.

``check`` is run in-process through the real dispatcher (``mfsdp.main``), which is the
same code path as the CLI minus the interpreter start; exit code 3 is the dispatcher's
"internal error" (a bug), so the property is: the exit code is always 0, 1 or 2 and
stderr never holds a traceback. A few runs go through a real subprocess too.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mfsdp
from mfsdp_lib import rules
from mfsdp_lib import schema as S

SECTIONS = list(S.CONTAINER_KEYS) + ["dpp", "_target_"]
KEYS = sorted({p.split(".", 1)[1] for p in S.FIELDS if "." in p}) + ["_target_", "use_megatron_fdsp", "bogus"]
ENUM_VALUES = sorted({c for rec in S.FIELDS.values() if rec[2] for c in rec[2]}) + ["optim_grad_params", "bf16_mixed"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(ENUM_VALUES),
    st.sampled_from(["yes", "maybe", "True", "4", "2.5", "1", ""]),
    st.text(max_size=12),
)
values = st.recursive(
    scalars,
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=6), c, max_size=3)),
    max_leaves=6,
)
sections = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), values, max_size=6)
configs = st.dictionaries(st.sampled_from(SECTIONS), st.one_of(sections, scalars), max_size=6)
override = st.builds(
    lambda s, k, v: f"{s}.{k}={v}",
    st.sampled_from(SECTIONS),
    st.sampled_from(KEYS),
    st.sampled_from(ENUM_VALUES + ["true", "null", "3", "x y", "[1,2]", "maybe", "2.5"]),
)
overrides = st.lists(st.one_of(override, st.text(max_size=15)), max_size=4)
envs = st.dictionaries(
    st.sampled_from([rules.MAX_CONN, "NVTE_CPU_OFFLOAD_V1", "PYTORCH_CUDA_ALLOC_CONF", "X"]),
    st.sampled_from(["1", "0", "32", "", "expandable_segments:True"]),
    max_size=3,
)


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = mfsdp.main(argv)
    return rc, out.getvalue(), err.getvalue()


def _assert_clean(rc, out, err, argv):
    assert rc in (0, 1, 2), f"exit {rc} for {argv}: {err}"
    assert "Traceback" not in err and "internal error" not in err, err
    if rc == 2 and not err.startswith("usage:"):  # argparse's own usage errors print the usage first
        assert len(err.strip().splitlines()) == 1, err


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(cfg=configs, ovr=overrides, env=envs, fmt=st.sampled_from(["text", "json"]))
def test_random_configs_never_traceback(cfg, ovr, env, fmt):
    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "c.yaml")
        with open(path, "w") as fh:
            fh.write(yaml.safe_dump(cfg, allow_unicode=True))
        argv = ["check", path, *[o for o in ovr if "=" in o], "--format", fmt]
        for k, v in env.items():
            argv += ["--env", f"{k}={v}"]
        rc, out, err = _run(argv)
        _assert_clean(rc, out, err, argv)
        if fmt == "json" and rc in (0, 1):
            assert json.loads(out)["ok"] is (rc == 0)


@FUZZ
@given(data=st.binary(max_size=600))
def test_random_bytes_never_traceback(data):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "c.yaml")
        with open(path, "wb") as fh:
            fh.write(data)
        rc, out, err = _run(["check", path])
        _assert_clean(rc, out, err, data)


@FUZZ
@given(ovr=overrides)
def test_random_overrides_never_traceback(ovr):
    rc, out, err = _run(["check", *ovr, "--env", "A=1"])
    _assert_clean(rc, out, err, ovr)
    rc, out, err = _run(["enable", *ovr, "--emit", "json", "--env", "A=1"])
    _assert_clean(rc, out, err, ovr)


@FUZZ
@given(cfg=configs, env=envs)
def test_evaluate_on_raw_dicts_never_raises(cfg, env):
    """Other modules (enable, smoke, differential) call rules.evaluate on dicts they built; it must never raise."""
    found = rules.evaluate(cfg, env, "hopper")
    assert all(f.severity in ("error", "warning", "info") for f in found)


@settings(max_examples=8, deadline=None)
@given(data=st.binary(min_size=1, max_size=300))
def test_subprocess_random_bytes(data):
    from conftest import run_cli

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "c.yaml")
        with open(path, "wb") as fh:
            fh.write(data)
        p = run_cli("check", path)
        _assert_clean(p.returncode, p.stdout, p.stderr, data)
