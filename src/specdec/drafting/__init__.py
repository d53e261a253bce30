"""Drafting methods: one module each, behind the Proposer interface of base.py."""
