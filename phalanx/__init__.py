"""Phalanx: many GPU servers, working like one."""

__version__ = "0.1.0"
