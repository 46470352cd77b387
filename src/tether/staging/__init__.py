"""Staged runs: a run's writes land in a copy of its workspace, reviewed once and applied or undone
as a whole (docs/safety.md, "Staged changes").

    from tether.staging import StagedWorkspace
    from tether.tools.builtin import coding_tools

    stage = StagedWorkspace.create("~/project")                  # copies the workspace (not .git, .venv ...)
    agent = Agent(model, tools=coding_tools("~/project", stage=stage))
    result = agent.run("Fix the failing test")
    for change in stage.changes():                      # + added, ~ changed, - deleted
        print(change.describe(), change.runs_later or "")
    stage.apply()                                       # all but code that runs later; undo() reverts
"""

from tether.staging._runs_later import git_config_runs, git_dir_shaped, runs_later
from tether.staging._stage import (
    PASSTHROUGH,
    ApplyReport,
    Change,
    FileState,
    StagedWorkspace,
    StageExists,
    entry_of,
    stages_dir,
)

__all__ = [
    "PASSTHROUGH",
    "ApplyReport",
    "Change",
    "FileState",
    "StageExists",
    "StagedWorkspace",
    "entry_of",
    "git_config_runs",
    "git_dir_shaped",
    "runs_later",
    "stages_dir",
]
