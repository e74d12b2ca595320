"""Herald: embedding scheduling for exactly synchronous training with far fewer embedding
transmissions (docs/design.md section 7). `Scheduler` plans, with the options of `HeraldOptions`;
hetu.rows.herald.HeraldTable executes the plan on a worker; the `schedule_embeddings` pass binds
them into the executor."""
from .options import HeraldOptions  # noqa: F401
from .scheduler import Plan, Scheduler  # noqa: F401
