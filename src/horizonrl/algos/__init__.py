"""Advantage estimators and losses; `gigpo_advantages` is the public entry point for step-level credit."""

from horizonrl.algos.gigpo import gigpo_advantages

__all__ = ["gigpo_advantages"]
