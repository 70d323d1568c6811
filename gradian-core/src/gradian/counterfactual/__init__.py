"""The two honest checks on an attribution: counterfactual retraining (`gradian verify`) and injection (`gradian inject`).

- ``recovery``: the recovered fraction of lost capability and its paired bootstrap CI (pure numpy).
- ``controls``: seeded random drop sets of the accused cluster's size, disjoint from it.
- ``drop_set``: what to drop, read from an attribution report or an ids file, and the defaults the report names.
- ``retrain``: training a drop set through ``gradian.pipelines.train`` with reuse of identical earlier runs.
- ``verify`` / ``inject``: the two commands' pipelines; ``summary``: their verify.md / inject.md and JSON.

Importing this package imports nothing heavy; torch and transformers load when a check trains or evaluates.
"""
