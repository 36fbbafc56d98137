"""Fault injection: kill a stage at a chosen point, rerun, compare with an undisturbed run (harness.py)."""
