"""A model of the multi-tile forward's barrier protocol (the persistent build, kernels_src/fwd.cu's
DASH_PERSISTENT, and with ``--pairs`` the two tiles per CTA of a tile-pairs patch, in git history): one producer
lane and two MMA warpgroups of one CTA, random interleavings and TMA completion delays, random tile lists (KV
tiles per tile, 0 allowed). Checks: no deadlock, every mbarrier parity wait succeeds on the phase it means (never a
phase behind or two ahead), no warpgroup arrives twice in one generation of a named barrier (the ping-pong turn).
No GPU; a design check of the protocol, not of the kernel's code.

    python benchmarks/fwd_protocol_model.py 3000              # the persistent build's protocol: ok
    python benchmarks/fwd_protocol_model.py 3000 --pairs --q-on-kv-only   # tile pairs: two tiles per CTA, ok
    python benchmarks/fwd_protocol_model.py 300 --q-on-kv-only   # Q loaded only for tiles with KV tiles: fails

The last is the protocol before the fix: a parity wait tells apart two phases only, and tiles without KV tiles let
the producer run two q_empty phases ahead of the epilogues."""
import random
import sys

from protocol_sim import Mbar, interleave, parity_wait

S = 2  # K/V stages
FIXED = True   # Q loaded for every tile of a persistent CTA (as built); --q-on-kv-only: the protocol before


class Named:
    def __init__(self, name):
        self.name, self.count, self.gen, self.arrived = name, 0, 0, set()

    def arrive(self, who):
        assert who not in self.arrived, f"{self.name}: {who} arrives twice in generation {self.gen}"
        self.arrived.add(who)
        self.count += 128
        if self.count == 256:
            self.count, self.gen, self.arrived = 0, self.gen + 1, set()


def run(tiles, seed, persistent=True):
    rng = random.Random(seed)
    bars = {n: Mbar(n, c) for n, c in [("q_full", 1), ("q_empty", 256), ("sf0", 1), ("sf1", 1), ("se0", 256),
                                        ("se1", 256)]}
    for s in range(S):
        bars[f"kf{s}"], bars[f"ke{s}"] = Mbar(f"kf{s}", 1), Mbar(f"ke{s}", 2)
        bars[f"vf{s}"], bars[f"ve{s}"] = Mbar(f"vf{s}", 1), Mbar(f"ve{s}", 2)
    T = [Named("T0"), Named("T1")]
    tx_events = []   # (bar, bytes)
    slots = [None, None]
    claims = iter(list(range(len(tiles))) + [len(tiles)] * 4)

    def tma(bar):
        bar.arrive(1, tx=1)
        tx_events.append(bar)

    def producer():
        j, kv, done = 0, 0, 0
        linear = next(claims)
        while True:
            if persistent:
                yield from parity_wait(bars[f"se{j % 2}"], j // 2 - 1)
                slots[j % 2] = linear
                bars[f"sf{j % 2}"].arrive()
            if linear >= len(tiles):
                return
            n = tiles[linear]
            if FIXED and n == 0:
                if done > 0:
                    yield from parity_wait(bars["q_empty"], done - 1)
                tma(bars["q_full"])
            if n > 0:
                def load(kind, i):
                    g = kv + i
                    yield from parity_wait(bars[f"{kind}e{g % S}"], g // S - 1)
                    tma(bars[f"{kind}f{g % S}"])
                if done == 0:
                    tma(bars["q_full"])
                    yield from load("k", 0)
                else:
                    yield from load("k", 0)
                    yield from parity_wait(bars["q_empty"], done - 1)
                    tma(bars["q_full"])
                for i in range(1, n):
                    yield from load("k", i)
                    yield from load("v", i - 1)
                yield from load("v", n - 1)
            kv += n
            done += 1
            linear = next(claims)
            j += 1

    def consumer(w):
        j, kv, loads = 0, 0, 0
        who = f"wg{w}"

        def turn_wait():
            gen = T[w].gen
            T[w].arrive(who)
            while T[w].gen == gen:
                yield

        def turn_pass():
            T[1 - w].arrive(who)
        while True:
            if persistent:
                yield from parity_wait(bars[f"sf{j % 2}"], j // 2)
                linear = slots[j % 2]
                bars[f"se{j % 2}"].arrive(128)
            else:
                linear = j if j < len(tiles) else len(tiles)
            if linear >= len(tiles):
                return
            n = tiles[linear]
            if n > 0:
                if w == 1:
                    turn_pass()
                yield from parity_wait(bars["q_full"], loads)
                g = kv
                yield from parity_wait(bars[f"kf{g % S}"], g // S)
                yield from turn_wait()
                turn_pass()
                yield
                bars[f"ke{g % S}"].arrive()
                for i in range(1, n):
                    g = kv + i
                    yield from parity_wait(bars[f"kf{g % S}"], g // S)
                    yield from turn_wait()
                    yield from parity_wait(bars[f"vf{(g - 1) % S}"], (g - 1) // S)
                    turn_pass()
                    yield
                    bars[f"ke{g % S}"].arrive()
                    bars[f"ve{(g - 1) % S}"].arrive()
                g = kv + n - 1
                yield from parity_wait(bars[f"vf{g % S}"], g // S)
                yield from turn_wait()
                if w == 0:
                    turn_pass()
                yield
                bars[f"ve{g % S}"].arrive()
                kv += n
                loads += 1
            elif FIXED:
                yield from parity_wait(bars["q_full"], loads)
                loads += 1
            yield   # the epilogue
            bars["q_empty"].arrive(128)
            j += 1

    actors = {"producer": producer(), "wg0": consumer(0), "wg1": consumer(1)}
    return interleave(actors, tx_events, rng, lambda bar: bar.complete_tx(1), limit=200000)


def random_tiles(seed, most):
    """KV tiles of each of 1 .. ``most`` tiles of a CTA (0: a tile no key of which a row sees), seeded."""
    rng = random.Random(seed)
    return [rng.choice([0, 1, 1, 2, 3, 5, 8]) for _ in range(rng.randint(1, most))]


if __name__ == "__main__":
    FIXED = "--q-on-kv-only" not in sys.argv
    trials = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 2000
    pairs = "--pairs" in sys.argv
    for seed in range(trials):
        tiles = random_tiles(1000 + seed, 2 if pairs else 7)
        for persistent in (True, False):
            try:
                run(tiles if persistent else tiles[:1], seed, persistent)
            except AssertionError as e:
                print("FAIL: seed", seed, "persistent" if persistent else "one tile", "KV tiles per tile", tiles, e)
                sys.exit(1)
    print("ok", trials, "random schedules, persistent and one-tile")
