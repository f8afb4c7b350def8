"""Launchers: the registry of launcher kinds (:data:`LAUNCHERS`, each answering for itself), and
the launchers that start a trial's processes (one per GPU), or answer it from a table, as a typed
measurement."""

from explorer.launch._command import trial_command, trial_environment, zygote_environment
from explorer.launch._contract import Launcher, LauncherKind, launcher_section
from explorer.launch._placement import ModelPlacement, accelerator_type
from explorer.launch._ray import RayLauncher, TrialActor, ZygoteHost
from explorer.launch._ray_health import RayLost
from explorer.launch._ray_kind import RayKind
from explorer.launch._replay import ReplayLauncher, ReplayTable
from explorer.launch._replay_kind import ReplayKind, replay_selection
from explorer.launch._run import collect, run_trial
from explorer.launch._select import LAUNCHERS, launcher_for, launcher_kind
from explorer.launch._slot import SLOT_ATTR, GpuSlot
from explorer.launch._warm import ensure_zygote

__all__ = [
    "LAUNCHERS",
    "SLOT_ATTR",
    "GpuSlot",
    "Launcher",
    "LauncherKind",
    "ModelPlacement",
    "RayKind",
    "RayLauncher",
    "RayLost",
    "ReplayKind",
    "ReplayLauncher",
    "ReplayTable",
    "TrialActor",
    "ZygoteHost",
    "accelerator_type",
    "collect",
    "ensure_zygote",
    "launcher_for",
    "launcher_kind",
    "launcher_section",
    "replay_selection",
    "run_trial",
    "trial_command",
    "trial_environment",
    "zygote_environment",
]
