"""Launchers: start a trial's processes (one per GPU) and return a typed measurement."""

from explorer.launch._command import trial_command, trial_environment, zygote_environment
from explorer.launch._ray import RayLauncher, TrialActor, ZygoteHost
from explorer.launch._run import collect, run_trial
from explorer.launch._warm import ensure_zygote

__all__ = [
    "RayLauncher",
    "TrialActor",
    "ZygoteHost",
    "collect",
    "ensure_zygote",
    "run_trial",
    "trial_command",
    "trial_environment",
    "zygote_environment",
]
