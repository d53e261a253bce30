"""`specdec check`: a lossless regression gate on a shipped set of cases.

cases.py (the shipped case set), greedy.py (plain against speculative, batched, first divergence),
sampling.py (seeded sampling against the target's exact probabilities), settings.py (options, defaults),
gate.py (runs the checks, decides pass or fail), report.py (JSON, Markdown, rich table), command.py
(`specdec check`).
"""
