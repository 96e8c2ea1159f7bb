"""The router: an OpenAI-compatible gateway in front of a deployment's replicas."""
