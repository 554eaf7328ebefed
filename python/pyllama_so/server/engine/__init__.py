"""The server's engine: slots over one llama.cpp context, and the thread that decodes them in shared batches.

core.Engine runs it; scheduler.Scheduler decides each step (a StepPlan), apart from carrying it out
(admission.Admitter, executor.Executor) and from what the jobs are told (results.Results). Everything here runs
without HTTP.
"""

from pyllama_so.server.engine.core import Engine
from pyllama_so.server.engine.job import (
    SHUTTING_DOWN,
    Delta,
    Done,
    EngineStopped,
    Event,
    Failed,
    Job,
    PromptError,
    QueueFull,
    Timings,
    Usage,
)
from pyllama_so.server.engine.scheduler import PREFIX_SHARE, Admission, PromptPiece, Scheduler, StepPlan, id_runs
from pyllama_so.server.engine.slot import Slot, SlotInfo, SlotState, SlotView
from pyllama_so.server.engine.stats import STEP_PHASES, Counters, EngineSnapshot, Step

__all__ = ["PREFIX_SHARE", "SHUTTING_DOWN", "STEP_PHASES", "Admission", "Counters", "Delta", "Done", "Engine",
           "EngineSnapshot", "EngineStopped", "Event", "Failed", "Job", "PromptError", "PromptPiece", "QueueFull",
           "Scheduler", "Slot", "SlotInfo", "SlotState", "SlotView", "Step", "StepPlan", "Timings", "Usage", "id_runs"]
