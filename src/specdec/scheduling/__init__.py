"""Scheduling: which sequences run in each engine step, with how many rows, and how long their drafts are."""
