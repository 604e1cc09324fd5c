"""A model of the backward main kernel's barrier protocol around the dK / dV epilogue (kernels_src/bwd/producer.cuh,
mainloop.cuh, epilogue.cuh): one producer lane and two MMA warpgroups of one CTA over random runs of visits (visits
per KV tile, 1 allowed), random interleavings and TMA completion delays. Checks: no deadlock; every mbarrier parity
wait succeeds on the phase it means; and the shared memory the epilogue stages dK / dV in is neither read by a GEMM
nor loaded by TMA while the staging writes it, nor written (by a TMA load, the next visits' dS^T stores or the next
staging) while a TMA store still reads it. The dQ writer warps are left out (they touch none of these barriers or
tiles). No GPU; a design check of the protocol, not of the kernel's code.

    python benchmarks/bwd_protocol_model.py 2000                  # the tree's epilogue (dV, then dK, in the dS tiles)
    python benchmarks/bwd_protocol_model.py 2000 --one-pass       # benchmarks/patches/dkv_one_pass.patch
    python benchmarks/bwd_protocol_model.py 300 --one-pass --no-hold   # dK in the Q / dO stages, freed early: fails
"""
import random
import sys

from protocol_sim import Mbar, interleave, parity_wait

STAGES = 2   # Q and dO stages (kStages, kDoStages)


class Named:
    """A named barrier of both MMA warpgroups (256 threads)."""

    def __init__(self, name):
        self.name, self.gen, self.arrived = name, 0, set()

    def sync(self, who):
        assert who not in self.arrived, f"{self.name}: {who} twice in generation {self.gen}"
        gen = self.gen
        self.arrived.add(who)
        if len(self.arrived) == 2:
            self.gen, self.arrived = gen + 1, set()
        while self.gen == gen:
            yield


def run(tiles, seed, one_pass=False, hold=True, k_stages=1):
    """``tiles``: visits per KV tile of one CTA, in order; ``one_pass``: dK staged in the last visit's Q / dO stages
    (dkv_one_pass.patch), whose empty arrivals wait for the stores (``hold``) until the next visit."""
    rng = random.Random(seed)
    visits = [(i == 0, i == n - 1) for n in tiles for i in range(n)]     # (first, last) in the KV tile
    bars = {}
    for s in range(STAGES):
        for kind in ("q", "do"):
            bars[f"{kind}_full{s}"] = Mbar(f"{kind}_full{s}", 1)
            bars[f"{kind}_empty{s}"] = Mbar(f"{kind}_empty{s}", 2)
    for s in range(k_stages):
        bars[f"k_full{s}"], bars[f"k_empty{s}"] = Mbar(f"k_full{s}", 1), Mbar(f"k_empty{s}", 2)
    bars["v_full"], bars["v_empty"] = Mbar("v_full", 1), Mbar("v_empty", 2)
    pds, dkv = Named("PdS"), Named("Dkv")
    loading = {}     # region -> TMA loads in flight into it
    readers = {}     # region -> warpgroups whose GEMMs may still read it
    store_reads = {}  # region -> TMA stores that have not read it yet
    pending = {0: [], 1: []}   # the issuing thread's stores per warpgroup (its bulk group)
    events = []      # ("load", bar, region) | ("store", w, region)

    def tma_load(bar, region):
        assert not store_reads.get(region) and not readers.get(region), f"load into {region} while it is read"
        bar.arrive(tx=1)
        loading[region] = loading.get(region, 0) + 1
        events.append(("load", bar, region))

    def producer():
        groups = 0
        for j, (first, _) in enumerate(visits):
            s = j % STAGES
            yield from parity_wait(bars[f"q_empty{s}"], j // STAGES - 1)
            tma_load(bars[f"q_full{s}"], ("q", s))
            if first:
                kb = groups % k_stages
                yield from parity_wait(bars[f"k_empty{kb}"], groups // k_stages - 1)
                tma_load(bars[f"k_full{kb}"], ("k", kb))
                yield from parity_wait(bars["v_empty"], groups - 1)
                tma_load(bars["v_full"], ("v",))
                groups += 1
            yield from parity_wait(bars[f"do_empty{s}"], j // STAGES - 1)
            tma_load(bars[f"do_full{s}"], ("do", s))

    def stage_write(region):
        assert not loading.get(region), f"staging into {region} while TMA loads it"
        assert not readers.get(region), f"staging into {region} while {readers[region]} may read it"
        assert not store_reads.get(region), f"staging into {region} while a store reads it"
        yield

    def issue_store(region, w):
        store_reads[region] = store_reads.get(region, 0) + 1
        pending[w].append(region)
        events.append(("store", w, region))

    def wait_reads(w):
        while pending[w]:
            yield

    def consumer(w):
        who, groups = f"wg{w}", 0
        for j, (first, last) in enumerate(visits):
            s, kb = j % STAGES, groups % k_stages
            yield from parity_wait(bars[f"q_full{s}"], j // STAGES)
            if first:
                yield from parity_wait(bars[f"k_full{kb}"], groups // k_stages)
            readers.setdefault(("q", s), set()).add(w)          # S^T (and later dK) read Q
            if first:
                yield from parity_wait(bars["v_full"], groups)
            yield from parity_wait(bars[f"do_full{s}"], j // STAGES)
            readers.setdefault(("do", s), set()).add(w)         # dP^T (and later dV) read dO
            if first:                                           # dkv_staging_free
                yield from wait_reads(w)
                if one_pass and hold and j > 0:
                    p = (j - 1) % STAGES
                    bars[f"q_empty{p}"].arrive()
                    bars[f"do_empty{p}"].arrive()
                yield from dkv.sync(who)
            yield
            if last:
                bars["v_empty"].arrive()                        # dP^T was V's last use
            assert not store_reads.get(("ds",)), "dS^T stored while a store reads the dS tiles"
            readers.setdefault(("ds",), set()).add(w)           # the other warpgroup's dQ reads our dS^T too
            yield from pds.sync(who)
            yield
            held = one_pass and hold and last
            if not held:
                bars[f"do_empty{s}"].arrive()
            if last:
                bars[f"k_empty{kb}"].arrive()
            yield
            for region in (("q", s), ("do", s), ("ds",)):       # wgmma_wait<0>: this warpgroup's GEMMs are done
                readers[region].discard(w)
            if not held:
                bars[f"q_empty{s}"].arrive()
            if last:                                            # stage_dkv
                yield from dkv.sync(who)
                if one_pass:
                    yield from stage_write(("ds",))
                    yield from stage_write(("q", s) if w == 0 else ("do", s))
                    yield from dkv.sync(who)
                    issue_store(("ds",), w)
                    issue_store(("q", s) if w == 0 else ("do", s), w)
                else:
                    yield from stage_write(("ds",))
                    yield from dkv.sync(who)
                    issue_store(("ds",), w)
                    yield from wait_reads(w)
                    yield from dkv.sync(who)
                    yield from stage_write(("ds",))
                    yield from dkv.sync(who)
                    issue_store(("ds",), w)
                groups += 1
        yield from wait_reads(w)                                # bulk_wait<0> at the end of consume

    def complete(ev):
        if ev[0] == "load":
            ev[1].complete_tx()
            loading[ev[2]] -= 1
        else:
            store_reads[ev[2]] -= 1
            pending[ev[1]].remove(ev[2])

    actors = {"producer": producer(), "wg0": consumer(0), "wg1": consumer(1)}
    return interleave(actors, events, rng, complete)


def random_tiles(seed, most=6):
    """Visits of each of 1 .. ``most`` KV tiles of a CTA (1 .. 9 each, single-visit tiles often), seeded."""
    rng = random.Random(seed)
    return [rng.choice([1, 1, 2, 3, 5, 9]) for _ in range(rng.randint(1, most))]


if __name__ == "__main__":
    trials = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 2000
    one_pass, hold = "--one-pass" in sys.argv, "--no-hold" not in sys.argv
    for seed in range(trials):
        for k_stages in (1, 2):
            run(random_tiles(1000 + seed), seed, one_pass, hold, k_stages)
    print(f"ok: {trials} random runs x K stages 1, 2 ({'one pass' if one_pass else 'two passes'})")
