"""Hydra plugins of this project (Hydra makes sweepers only of classes under ``hydra_plugins``)."""
