"""A model of the dQ hand-off between the MMA warpgroups and the dQ writer warps with the dQ split by keys
(benchmarks/patches/dq_split_by_keys.patch): named barriers with arrive / sync (a sync counts as an arrival and
waits for the generation to complete; two parties per barrier: a warpgroup and a writer warp), two hand-offs per
warpgroup and visit, one writer (atomic) or two alternating visits with a token (deterministic), and the stage
coupling (a warpgroup starts visit j once both have finished visit j - 2: the Q / dO stages). Random schedules;
reports any deadlock or arrival left over at the end. CPU only.

    python benchmarks/dq_handoff_model.py
"""
import random


def _warpgroup(w, visits, done):
    for v in range(visits):
        yield ("cond", lambda v=v: min(done.values()) >= v - 2)
        for _ in range(2):                      # head-dim halves 0 and 1
            yield ("sync", f"empty{w}")
            yield ("arrive", f"full{w}")
        done[w] = v


def _writer(wi, writers, visits):
    if wi == 0:
        yield ("arrive", "empty0")
        yield ("arrive", "empty1")
    for j, v in enumerate(range(wi, visits, writers)):
        if writers == 2 and (j > 0 or wi > 0):
            yield ("sync", f"tok{wi}")
        for h in range(2):
            more = h + 1 < 2 or v + 1 < visits
            for w in (0, 1):
                yield ("sync", f"full{w}")
                if more:
                    yield ("arrive", f"empty{w}")
        if writers == 2 and v + 1 < visits:
            yield ("arrive", f"tok{wi ^ 1}")


def run(visits, writers, seed):
    """(finished, details): details names the blocked operations of a deadlock, or the barriers with arrivals left."""
    rnd = random.Random(seed)
    arrived = {k: 0 for k in ("full0", "full1", "empty0", "empty1", "tok0", "tok1")}
    gen = dict.fromkeys(arrived, 0)
    done = {0: -1, 1: -1}
    procs = {("wg", 0): _warpgroup(0, visits, done), ("wg", 1): _warpgroup(1, visits, done)}
    procs.update({("writer", i): _writer(i, writers, visits) for i in range(writers)})
    pending, blocked, finished = dict.fromkeys(procs), {}, set()

    def arrive(bar):
        arrived[bar] += 1
        if arrived[bar] == 2:
            arrived[bar], gen[bar] = 0, gen[bar] + 1

    def step(p):
        if pending[p] is None:
            try:
                pending[p] = next(procs[p])
            except StopIteration:
                finished.add(p)
                return True
        kind, arg = pending[p]
        if kind == "cond":
            ok = arg()
        elif kind == "arrive":
            arrive(arg)
            ok = True
        else:
            if p not in blocked:
                blocked[p] = gen[arg]
                arrive(arg)
            ok = gen[arg] > blocked[p]
            if ok:
                del blocked[p]
        if ok:
            pending[p] = None
        return ok

    while len(finished) < len(procs):
        live = [p for p in procs if p not in finished]
        rnd.shuffle(live)
        if not any(step(p) for p in live):
            return False, {p: pending[p] for p in live}
    return True, {k: n for k, n in arrived.items() if n}


def main():
    failures = 0
    for writers in (1, 2):
        for visits in (1, 2, 3, 5, 8):
            for seed in range(300):
                ok, details = run(visits, writers, seed)
                if not ok or details:
                    failures += 1
                    print(f"writers {writers}, {visits} visits, seed {seed}: {'left over' if ok else 'deadlock'} "
                          f"{details}")
    print(f"{failures} failing schedules of {2 * 5 * 300}")


if __name__ == "__main__":
    main()
