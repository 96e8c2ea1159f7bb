"""Alembic migrations of the head's schema."""
