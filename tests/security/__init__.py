"""Attacks of one user on another, the agent and the head; real Unix users (root only)."""
