"""Hydra launchers of this project (Hydra makes launchers only of classes under ``hydra_plugins``)."""
