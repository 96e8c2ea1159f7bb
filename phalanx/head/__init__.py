"""The control plane: REST API, durable store, auth and the control loop around core."""
