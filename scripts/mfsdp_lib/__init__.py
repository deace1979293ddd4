"""Library behind scripts/mfsdp.py, organised by concern.

Where things live (a newcomer should find a rule, a memory term or a command in one step):

* ``cli/``        - one thin module per subcommand of scripts/mfsdp.py (``configure`` + ``run``);
                    ``cli/common.py`` loads and runs a command (no tracebacks for bad input).
* ``rules/``      - THE rule table: typed ``Rule`` records (``rules/model.py``), one module per
                    topic (core, checkpoint, environment, parallel, precision, activations,
                    cuda_graphs), the registry and ``evaluate`` in ``rules/__init__.py``;
                    ``rules/differential.py`` replays real Bridge verdicts through it.
* ``memory/``     - per-GPU memory model: ``shapes`` (model shapes, parameter counting),
                    ``terms`` (precision, activations), ``strategies`` (model state per
                    strategy), ``estimate`` (totals and the report).
* ``runs/``       - what a run leaves behind: ``logs``, ``checkpoints`` (with ``checkpoint_files``
                    and the no-unpickle ``pickle_reader``), and the GPU ``smoke`` test.
* ``integrity/``  - ``signature`` (skill.oms.sig), ``anchors`` (code anchors in SKILL.md and
                    references/), ``sources`` (finding the real Megatron-Bridge source).
* ``findings``    - the Finding record, text/JSON rendering, exit codes, InputError.
* ``schema``      - the Bridge 0.6.x fields the rules read: type, default, allowed values.
* ``config_io``   - loading YAML / ``key=value`` overrides into an effective config, writing it back.
* ``enable``      - the Megatron FSDP overrides and how they are applied.
"""

__version__ = "0.1.0"

# The skill's name: SKILL.md's frontmatter name, the installed folder's name, the signature's subject.
# The one constant in code; tests/test_skill_md.py holds SKILL.md, pyproject.toml and the cards to it.
SKILL_NAME = "nemo-mbridge-perf-megatron-fsdp"

# The versions every fact in this skill was checked against.
PINNED_BRIDGE = "0.6.2"
PINNED_MCORE = "0.19.2"
