"""activity-app: federated activity recognition from wrist accelerometers, on fedstream."""
