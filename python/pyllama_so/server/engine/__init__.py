"""The server's engine: slots over one llama.cpp context, and the thread that decodes them in shared batches
(core.py)."""

from pyllama_so.server.engine.core import (
    PREFIX_SHARE,
    SHUTTING_DOWN,
    STEP_PHASES,
    Counters,
    Delta,
    Done,
    Engine,
    EngineSnapshot,
    EngineStopped,
    Event,
    Failed,
    Job,
    PromptError,
    QueueFull,
    Slot,
    SlotState,
    SlotView,
    Step,
    Timings,
    Usage,
    id_runs,
)

__all__ = ["PREFIX_SHARE", "SHUTTING_DOWN", "STEP_PHASES", "Counters", "Delta", "Done", "Engine", "EngineSnapshot",
           "EngineStopped", "Event", "Failed", "Job", "PromptError", "QueueFull", "Slot", "SlotState", "SlotView", "Step",
           "Timings", "Usage", "id_runs"]
