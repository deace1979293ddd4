"""Hugging Face configs for recipes, offline: ``--hf-config [MODEL_ID=]PATH``, and a missing one named at once.

Bridge's model recipes build their provider from a model id's ``config.json``
(``megatron/bridge/recipes/llama/h100/llama3.py`` :: ``AutoBridge.from_hf_pretrained("meta-llama/Meta-Llama-3-8B")``,
through ``megatron/bridge/models/hf_pretrained/safe_config_loader.py`` :: ``safe_load_config_with_retry``,
which retries with back-off). On a GPU node without internet that costs minutes and ends in a
network error at the config phase.

:func:`prepare` (before megatron is imported: ``huggingface_hub`` reads its cache folder and
offline switch from the environment at import) lays each given config out as a hub cache in the
run's folder (``models--OWNER--NAME/snapshots/REV/config.json`` and ``refs/main``, the layout
``huggingface_hub`` resolves offline) and sets ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE=1`` and
``TRANSFORMERS_OFFLINE=1``. :func:`guard` (after the import, before the recipe runs) wraps
``AutoBridge.from_hf_pretrained``: a model id that has a config given, or that is in the local
cache, goes through; a config given without an id serves the id the recipe asks for; any other id
is refused at once when the hub is offline or cannot be reached, with the id and how to provide
it, instead of the retries.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket

HUB_HOST = "huggingface.co"
REACH_TIMEOUT_S = 3.0  # one connection attempt says whether the hub can be reached at all
OFFLINE_VALUES = ("1", "true", "yes", "on")


class MissingConfig(ValueError):
    """A recipe needs a Hugging Face config this machine cannot get (the message says how to give it)."""


def parse_specs(specs: list[str] | None) -> tuple[dict[str, str], str | None]:
    """``["ID=PATH", "PATH"]`` -> ({model id: config.json path}, the config given without an id)."""
    by_id: dict[str, str] = {}
    default = None
    for spec in specs or []:
        model_id, sep, path = spec.partition("=") if "=" in spec else ("", "", spec)
        path = os.path.join(path, "config.json") if os.path.isdir(path) else path
        if sep:
            by_id[model_id] = path
        else:
            default = path
    return by_id, default


def repo_folder(cache: str, model_id: str) -> str:
    """huggingface_hub's folder for a model repository in a cache: ``models--OWNER--NAME``."""
    return os.path.join(cache, "models--" + model_id.replace("/", "--"))


COMMIT = re.compile(r"[0-9a-f]{40}")  # a revision that is a commit names its snapshot folder itself


def lay_out(cache: str, model_id: str, config_path: str, revision: str | None = None) -> str:
    """Put ``config_path`` where huggingface_hub finds ``model_id``'s config.json offline; returns the file.

    Without ``revision`` it is the ``main`` branch. Recipes may pin one (Bridge's Qwen3 MoE recipes pass
    ``revision=<commit>`` to ``AutoBridge.from_hf_pretrained``): huggingface_hub then looks in
    ``snapshots/<commit>/`` for a commit, or reads ``refs/<branch or tag>`` for a name, so the same file
    is laid out under that revision too."""
    with open(config_path, "rb") as fh:
        data = fh.read()
    json.loads(data)  # a config that is not JSON fails here, with its path, not inside transformers
    rev = hashlib.sha1(data).hexdigest()  # a snapshot folder is named by a 40-hex revision
    ref: str | None = "main"
    if revision and COMMIT.fullmatch(str(revision)):
        rev, ref = str(revision), None
    elif revision:
        ref = str(revision)
    folder = repo_folder(cache, model_id)
    snap = os.path.join(folder, "snapshots", rev)
    os.makedirs(snap, exist_ok=True)
    dst = os.path.join(snap, "config.json")
    shutil.copyfile(config_path, dst)
    if ref is not None:
        ref_path = os.path.join(folder, "refs", *ref.split("/"))
        os.makedirs(os.path.dirname(ref_path), exist_ok=True)
        with open(ref_path, "w") as fh:
            fh.write(rev)
    return dst


def prepare(specs: list[str] | None, out_dir: str) -> dict:
    """Lay out the given configs as an offline hub cache under ``out_dir`` and point the environment at it."""
    by_id, default = parse_specs(specs)
    state: dict = {"cache": None, "ids": {}, "default": default, "offline": False}
    if not by_id and not default:
        return state
    cache = os.path.join(os.path.abspath(out_dir), "hf_hub")
    os.makedirs(cache, exist_ok=True)
    state["sources"] = {}
    for model_id, path in by_id.items():
        state["ids"][model_id] = lay_out(cache, model_id, path)
        state["sources"][model_id] = path
    os.environ["HF_HUB_CACHE"] = cache
    os.environ["HUGGINGFACE_HUB_CACHE"] = cache
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    state.update(cache=cache, offline=True)
    return state


def hub_reachable(host: str = HUB_HOST, timeout: float = REACH_TIMEOUT_S) -> bool:
    endpoint = os.environ.get("HF_ENDPOINT", "")
    if "://" in endpoint:
        host = endpoint.split("://", 1)[1].split("/", 1)[0].split(":", 1)[0] or host
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def cached(model_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    try:
        return isinstance(try_to_load_from_cache(model_id, "config.json"), str)
    except Exception:  # a malformed id or cache: not cached
        return False


def missing_message(model_id: str, offline: bool) -> str:
    why = "the hub is switched off (HF_HUB_OFFLINE)" if offline else f"{HUB_HOST} cannot be reached"
    return (
        f"the recipe builds its model from the Hugging Face config of {model_id}, which is not in this "
        f"machine's cache and {why}; give it with --hf-config {model_id}=PATH (a config.json or the folder "
        "holding it)"
    )


def check(model_id: str, state: dict) -> None:
    """Let ``model_id`` through, lay out the default config for it, or raise :class:`MissingConfig`."""
    if os.path.exists(model_id) or model_id in state.get("ids", {}):
        return
    if state.get("default") and state.get("cache") and model_id.count("/") == 1:
        state["ids"][model_id] = lay_out(state["cache"], model_id, state["default"])
        state.setdefault("sources", {})[model_id] = state["default"]
        return
    if cached(model_id):
        return
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in OFFLINE_VALUES
    if offline or not hub_reachable():
        raise MissingConfig(missing_message(model_id, offline))


def pin_revision(model_id: str, revision, state: dict) -> str | None:
    """A recipe that pins ``revision`` for a model id whose config was given: lay the config out under
    that revision as well (:func:`lay_out`); returns the file, or None when nothing was to do."""
    source = (state.get("sources") or {}).get(model_id)
    if not revision or not source or not state.get("cache"):
        return None
    return lay_out(state["cache"], model_id, source, revision=str(revision))


def guard(state: dict, error_type: type[Exception] = MissingConfig) -> str:
    """Wrap ``AutoBridge.from_hf_pretrained`` with :func:`check`; ``error_type`` is raised (the engine's
    input error, so that the run exits 2 with one line). Returns what was done."""
    try:
        from megatron.bridge.models.conversion.auto_bridge import AutoBridge
    except Exception as exc:  # a Bridge without AutoBridge: recipes then fail as they would anyway
        return f"not wrapped: {type(exc).__name__}: {str(exc)[:200]}"

    orig = AutoBridge.__dict__.get("from_hf_pretrained")
    func = getattr(orig, "__func__", None)
    if func is None or getattr(func, "_rehearse_hf", False):
        return "not wrapped: AutoBridge.from_hf_pretrained is not a classmethod here"

    def from_hf_pretrained(cls, path, *args, **kwargs):
        try:
            check(str(path), state)
        except MissingConfig as exc:
            raise error_type(str(exc)) from None
        pin_revision(str(path), kwargs.get("revision"), state)
        return func(cls, path, *args, **kwargs)

    from_hf_pretrained._rehearse_hf = True  # type: ignore[attr-defined]
    AutoBridge.from_hf_pretrained = classmethod(from_hf_pretrained)
    return "AutoBridge.from_hf_pretrained checks the model id's config first"
