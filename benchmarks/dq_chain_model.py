"""A model of the backward's ordered dQ reduction across CTAs (kernels_src/bwd/dq_reduce.cuh): per CTA two MMA
warpgroups handing their dQ slices over in shared memory and two dQ writer warps taking alternate visits (a token
keeps the hand-offs in visit order), each writer waiting for its tile's turn on the tile's semaphore, putting the
slices with bulk adds (read out of shared memory, then complete, at random moments) and releasing. Random tables
(every tile's ranks in one global order, dealt to the CTAs in that order) and random interleavings. Checks: no
deadlock; a slice is added into a tile only after every lower rank's add of that slice has completed (the bits are
those of the rank order); a staging slice is not overwritten before its bulk add has read it; every semaphore ends
at its count. Two protocols: ``slices=1``, one turn per tile (semaphore r for rank r), and ``slices=2``, a turn per
slice (round 40's turn_slices.patch: slice 0 from 2 r - 1, slice 1 from 2 r, each released as it completes). No GPU;
a design check of the protocol, not of the kernel's code.

    python benchmarks/dq_chain_model.py 500            # both protocols over 500 random tables
    python benchmarks/dq_chain_model.py 200 --no-second-wait   # slice 1 put without its turn: fails
"""
import random
import sys

from protocol_sim import interleave


def random_table(seed):
    """(lists, ranks): per CTA its visits' tiles in order, and per CTA the visits' ranks. Every tile's visits are
    ranked in one random global order, which is dealt to the CTAs in order (so some schedule reaches every turn)."""
    rng = random.Random(seed)
    tiles = rng.randint(1, 5)
    order = [t for t in range(tiles) for _ in range(rng.randint(1, 5))]
    rng.shuffle(order)
    ctas = rng.randint(1, 4)
    lists, ranks, seen = [[] for _ in range(ctas)], [[] for _ in range(ctas)], {}
    for t in order:
        c = rng.randrange(ctas)
        lists[c].append(t)
        ranks[c].append(seen.get(t, 0))
        seen[t] = seen.get(t, 0) + 1
    return lists, ranks


def run(lists, ranks, seed, slices=2, second_wait=True):
    """One random interleaving of every CTA's MMA warpgroups and dQ writers over the table; asserts the checks."""
    rng = random.Random(seed)
    sem = {}
    done = {}            # (tile, slice) -> adds complete into it
    events = []          # [kind, cta, group]: "read" then "write" per bulk group
    actors = {}

    def cta_actors(c):
        tiles, rk = lists[c], ranks[c]
        n = len(tiles)
        full = [0, 0]        # per warpgroup: slices handed over
        free = [1, 1]        # per warpgroup: times the staging was freed (the first up front)
        staging = [None, None]
        unread = [0, 0]      # per warpgroup: bulk groups that have not read its staging yet
        token = [0]
        groups = {0: [], 1: []}   # per writer: its bulk groups not complete, in issue order

        def mma(wg):
            for j in range(n):
                while free[wg] <= j:
                    yield
                assert unread[wg] == 0, f"CTA {c}: staging {wg} overwritten before its bulk add read it"
                staging[wg] = j
                full[wg] += 1
                yield

        def put(w, j, wgs):
            """One bulk group of the slices of warpgroups ``wgs``: checked against the rank order when issued."""
            t, r = tiles[j], rk[j]
            for wg in wgs:
                while full[wg] <= j:
                    yield
                assert staging[wg] == j
                assert done.get((t, wg), 0) == r, f"tile {t} slice {wg}: rank {r} put before rank {r - 1} completed"
                unread[wg] += 1
            group = {"cta": c, "tile": t, "wgs": wgs, "read": False, "complete": False}
            groups[w].append(group)
            events.append(["read", group, unread])

        def turn(t, lo, hi):
            while not lo <= sem.get(t, 0) <= hi:
                assert sem.get(t, 0) <= hi, f"tile {t}: semaphore {sem.get(t, 0)} past {hi}"
                yield
            return sem.get(t, 0)

        def writer(w):
            for j in range(w, n, 2):
                t, r = tiles[j], rk[j]
                lo, hi = (2 * r - 1, 2 * r) if slices == 2 else (r, r)
                seen = yield from turn(t, lo, hi)
                while token[0] < j:
                    yield
                if slices == 2:
                    yield from put(w, j, (0,))
                    if second_wait and seen < 2 * r:
                        yield from turn(t, 2 * r, 2 * r)
                    yield from put(w, j, (1,))
                else:
                    yield from put(w, j, (0, 1))
                while any(not g["read"] for g in groups[w]):
                    yield
                for wg in (0, 1):
                    free[wg] += 1
                token[0] = j + 1
                for g in list(groups[w]):   # release each group as it completes, in issue order
                    while not g["complete"]:
                        yield
                    groups[w].remove(g)
                    sem[t] = sem.get(t, 0) + 1
                    yield

        actors[f"mma{c}.0"], actors[f"mma{c}.1"] = mma(0), mma(1)
        actors[f"writer{c}.0"], actors[f"writer{c}.1"] = writer(0), writer(1)

    for c in range(len(lists)):
        cta_actors(c)

    def complete(event):
        kind, group, unread = event
        if kind == "read":
            group["read"] = True
            for wg in group["wgs"]:
                unread[wg] -= 1
            events.append(["write", group, unread])
        else:
            group["complete"] = True
            for wg in group["wgs"]:
                done[(group["tile"], wg)] = done.get((group["tile"], wg), 0) + 1

    interleave(actors, events, rng, complete)
    counts = {}
    for tiles in lists:
        for t in tiles:
            counts[t] = counts.get(t, 0) + 1
    for t, k in counts.items():
        assert sem.get(t, 0) == slices * k, f"tile {t}: semaphore {sem.get(t, 0)}, not {slices * k}"
        assert done[(t, 0)] == done[(t, 1)] == k


def main(argv):
    n = int(argv[0]) if argv else 300
    second_wait = "--no-second-wait" not in argv
    for slices in (1, 2):
        for seed in range(n):
            lists, ranks = random_table(seed)
            run(lists, ranks, seed, slices=slices, second_wait=second_wait)
        print(f"slices={slices}: {n} random tables, every check held")


if __name__ == "__main__":
    main(sys.argv[1:])
