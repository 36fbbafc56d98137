"""Yardsticks: what every variant is scored on, whatever its data (reference text, downstream tasks)."""
