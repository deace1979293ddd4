"""The commands of scripts/mfsdp.py, one thin module each: configure(parser) and run(args)."""
