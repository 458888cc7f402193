"""Compiling for accelerators this machine does not have: targets and compile reports."""
