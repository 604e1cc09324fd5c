"""What the barrier-protocol models share (benchmarks/fwd_protocol_model.py, benchmarks/bwd_protocol_model.py): an
mbarrier with arrivals and a transaction count, its parity wait, and a random interleaving of generator actors with asynchronous
completions (TMA loads, stores). No GPU."""


class Mbar:
    """An mbarrier: a phase completes when ``count`` arrivals are in and the transaction count is back to 0; ``c``
    counts the completed phases."""

    def __init__(self, name, count):
        self.name, self.count, self.pending, self.tx, self.c = name, count, 0, 0, 0

    def arrive(self, n=1, tx=0):
        self.pending += n
        self.tx += tx
        self._check()

    def complete_tx(self, tx=1):
        self.tx -= tx
        self._check()

    def _check(self):
        assert self.pending <= self.count, f"{self.name}: too many arrivals"
        if self.pending == self.count and self.tx == 0:
            self.pending, self.c = 0, self.c + 1


def parity_wait(bar, phase):
    """A parity wait for ``phase`` of ``bar`` as the hardware runs it: passes once the parity of the completed phases
    differs from ``phase`` & 1 (an "empty" wait for phase -1 passes on a fresh barrier); yields until then and asserts
    that it passes on that phase only (never a phase behind or two ahead: an aliased parity)."""
    while True:
        assert bar.c <= phase + 1, f"{bar.name}: waited for phase {phase}, barrier already at {bar.c}"
        if bar.c % 2 != phase % 2:
            assert bar.c == phase + 1, f"{bar.name}: the wait for phase {phase} passed at {bar.c}"
            return
        yield


def interleave(actors, events, rng, complete, limit=400000):
    """Steps the generators of ``actors`` (name -> generator; a ``yield`` gives way) in a random order, and completes
    the pending ``events`` (a list the actors append to; ``complete(event)`` each) at random moments in between, until
    every actor has returned and every event completed. Returns the steps; asserts on no progress (a deadlock)."""
    steps = 0
    while actors or events:
        steps += 1
        assert steps < limit, "no progress (deadlock)"
        if events and (not actors or rng.random() < 0.3):
            complete(events.pop(rng.randrange(len(events))))
            continue
        name = rng.choice(list(actors))
        try:
            next(actors[name])
        except StopIteration:
            del actors[name]
    return steps
