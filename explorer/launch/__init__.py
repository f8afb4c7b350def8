"""Launchers: start a trial's processes (one per GPU) and return a typed measurement."""

from explorer.launch._command import trial_command, trial_environment
from explorer.launch._ray import RayLauncher, TrialActor
from explorer.launch._run import collect, run_trial

__all__ = ["RayLauncher", "TrialActor", "collect", "run_trial", "trial_command", "trial_environment"]
