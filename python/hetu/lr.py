"""Learning-rate schedules: `get(step)` gives the rate for optimizer step `step` (0-based)."""


class FixedScheduler:
    def __init__(self, learning_rate):
        self.learning_rate = learning_rate

    def get(self, step):
        return self.learning_rate


class StepScheduler(FixedScheduler):
    """Multiplies the rate by gamma every step_size steps."""

    def __init__(self, learning_rate, step_size, gamma=0.1):
        super().__init__(learning_rate)
        if step_size <= 0:
            raise ValueError(f"StepScheduler: step_size must be positive, got {step_size}")
        self.step_size, self.gamma = step_size, gamma

    def get(self, step):
        return self.learning_rate * self.gamma ** (step // self.step_size)


class MultiStepScheduler(FixedScheduler):
    """Multiplies the rate by gamma at each milestone step."""

    def __init__(self, learning_rate, milestones, gamma=0.1):
        super().__init__(learning_rate)
        self.milestones, self.gamma = sorted(milestones), gamma

    def get(self, step):
        return self.learning_rate * self.gamma ** sum(1 for m in self.milestones if step >= m)


class ExponentialScheduler(FixedScheduler):
    def __init__(self, learning_rate, gamma):
        super().__init__(learning_rate)
        self.gamma = gamma

    def get(self, step):
        return self.learning_rate * self.gamma ** step


def as_scheduler(lr):
    return lr if hasattr(lr, "get") else FixedScheduler(float(lr))
