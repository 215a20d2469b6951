"""Errors a user can cause. The CLI prints their message as one sentence and exits with code 2."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in what the user asked for (bad env id, bad hyperparameter, missing device, bad checkpoint)."""
