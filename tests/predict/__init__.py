"""Tests of research.predict (a package: its test files share their basenames with
tests/experiments', e.g. test_sequence_tasks.py, which pytest's default import mode takes
for one module otherwise)."""
