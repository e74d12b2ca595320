"""Herald's options, their defaults and checks: what run_laia.py's flags set and the Executor
takes as `herald=HeraldOptions(...)`."""
import dataclasses

ALLOCATORS = ("colocate", "greedy", "none")
PLANNERS = ("host", "worker")   # one planner per host, or one per worker
PROTOCOLS = ("herald", "het")

# The Executor's keywords for the fields, beside herald=True (docs/usage.md).
_KEYWORDS = {"lookahead": "lookahead", "allocator": "allocator", "herald_protocol": "protocol",
             "planners": "planners", "planner_threads": "planner_threads"}


@dataclasses.dataclass(frozen=True)
class HeraldOptions:
    """lookahead: iterations the scheduler plans ahead, at least 1 (the write-back plan of t
    depends on which worker reads which rows at t+1). allocator: 'colocate' (fewest rows moved),
    'greedy' (the cache score alone) or 'none' (plain data-parallel slices: the 'plan only'
    ablation). protocol: 'herald' (the caches follow the plan) or 'het' (Herald's allocation with
    the HET cache protocol: the 'allocator only' ablation). planners: 'host' (the first worker
    of each host plans for all of the host's workers) or 'worker'. planner_threads: a planner's
    threads, 0 for HETU_PLANNER_THREADS, else one per worker it plans for. The plans are the same
    whatever the planners and their threads."""
    lookahead: int = 2
    allocator: str = "colocate"
    protocol: str = "herald"
    planners: str = "host"
    planner_threads: int = 0

    def __post_init__(self):
        if self.lookahead < 1:
            raise ValueError(f"Herald needs --lookahead >= 1 (got {self.lookahead}): the write-back plan of "
                             f"iteration t depends on which worker reads which rows at t+1")
        for name, value, choices in (("allocator", self.allocator, ALLOCATORS),
                                     ("protocol", self.protocol, PROTOCOLS), ("planners", self.planners, PLANNERS)):
            if value not in choices:
                raise ValueError(f"unknown Herald {name} {value!r}: expected one of {', '.join(choices)}")
        if self.planner_threads < 0:
            raise ValueError(f"Herald: {self.planner_threads} planner threads; 0 (the default: HETU_PLANNER_THREADS, "
                             f"else one per worker planned for) or more")

    @classmethod
    def of_executor(cls, extra):
        """The options of an Executor's keywords `extra`: herald=HeraldOptions(...), or herald=True
        with the fields as keywords of their own (lookahead=, allocator=, herald_protocol=,
        planners=, planner_threads=); None without herald."""
        herald = extra.get("herald")
        loose = {field: extra[key] for key, field in _KEYWORDS.items() if key in extra}
        if isinstance(herald, cls):
            if loose:
                raise ValueError(f"herald=HeraldOptions(...) holds Herald's options: give "
                                 f"{', '.join(sorted(loose))} there")
            return herald
        return cls(**loose) if herald else None
