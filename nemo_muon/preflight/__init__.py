"""`nemo-muon preflight`: a recipe's exact optimizer path proven on the allocation's own ranks before the long job.

A tiny model of the recipe's family is trained a few steps with the recipe's optimizer, engine, collectives and
ownership next to a reference path of the same optimizer (`request.preflight_plan`), saved, resumed and given a
non-finite gradient (`run`); `checks` turns what that showed into verdicts with stated tolerances, `report` writes
``preflight.json`` / ``preflight.md``, and `main` is the command every rank runs.
"""
