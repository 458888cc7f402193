"""Experiments' tasks: `research.tasks.<config.task>` provides validate(config) and build(config).

See research/training/task.py for the contract.
"""
