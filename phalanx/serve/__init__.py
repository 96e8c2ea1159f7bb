"""Serving: replica pools of real inference engines, the router, the autoscaler (docs/serving.md)."""
