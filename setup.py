"""Dataflow stages this repository to its workers with `--setup_file=setup.py`; everything is in setup.cfg."""

from setuptools import setup

setup()
