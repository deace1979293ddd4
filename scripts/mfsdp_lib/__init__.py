"""Library behind scripts/mfsdp.py: one module per concern.

Where things live (a newcomer should find a rule in one step):

* ``findings``   - the Finding record, text/JSON rendering, exit codes, InputError.
* ``cliutil``    - how a command module is loaded and run (no tracebacks for bad input).
* ``schema``     - the Bridge 0.6.x fields the rules read: type, default, allowed values.
* ``config_io``  - loading YAML / ``key=value`` overrides into an effective config, writing it back.
* ``rules``      - THE rule table: every Megatron FSDP constraint, with id, severity, fix, source anchor.
* ``enable``     - the Megatron FSDP overrides and how they are applied.
* ``checkpoints``- reading checkpoint folders (metadata only, never tensors).
* ``logs``       - streaming judge of Megatron-Bridge training logs and pytest output.
* ``memory``     - per-GPU memory model for DDP, distributed optimizer and FSDP strategies.
* ``anchors``    - verifying the code anchors cited by SKILL.md and references/.
* ``cli_*``      - thin argparse glue, one per subcommand of scripts/mfsdp.py.
"""

__version__ = "0.1.0"

# The versions every fact in this skill was checked against.
PINNED_BRIDGE = "0.6.2"
PINNED_MCORE = "0.19.2"
