"""Herald: embedding scheduling for exactly synchronous training with far fewer embedding
transmissions (docs/design.md section 7). `Scheduler` plans; `HeraldTable` executes the plan on a
worker; the `schedule_embeddings` pass binds them into the executor."""
from .scheduler import Plan, Scheduler  # noqa: F401
from .table import HeraldTable, PlanMismatch  # noqa: F401
