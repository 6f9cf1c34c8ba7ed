"""The command line: `python -m specviz` / the `specviz` script, and the bench harness."""
