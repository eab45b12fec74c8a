"""The cost model's price of deciding a routed call's tiles at points of a token grid instead of at its own count
(CPU only): over 257..8192 tokens (every third count) of ten benchmark layers, the model's predicted time of
(a) the lower grid point's choice, (b) the faster (at the call's count) of the two points' choices, over its best
choice at the call's count; grids of 8 / 16 / 32 points per octave.

    PYTHONPATH=python python docs/perf/2026-12-07-selection-grid/predicted_loss.py
"""

import math

from w4a16_moe.kernels.cute import cost_model
from w4a16_moe.kernels.cute.sm90 import family as sm90

LAYERS = [((384, 7168, 256, 8, None), "int4_g32"), ((32, 7168, 2048, 8, 256), "int4_g128"),
          ((256, 7168, 256, 8, None), "int4_g128"), ((128, 4096, 384, 8, None), "int4_g128"),
          ((16, 5120, 8192, 1, None), "int4_g128"), ((128, 5120, 1024, 1, None), "int4_g128"),
          ((60, 2048, 704, 4, None), "int4_g32"), ((8, 4096, 14336, 2, None), "int4_g128"),
          ((16, 4096, 1536, 8, 128), "int4_g128"), ((20, 5120, 1536, 8, 160), "int4_g128")]


def points(t: int, per_octave: int) -> tuple:
    q = max(1, (1 << (t.bit_length() - 1)) // per_octave)
    lo = t // q * q
    return (lo, lo + q)


def main():
    print("| layer | scheme | " + " | ".join(f"{n}/octave: lower point | {n}/octave: faster point" for n in (8, 16, 32))
          + " |")
    print("|---|---|" + "---|---|" * 3)
    for (e, h, i, k, g), scheme in LAYERS:
        pool = sm90.model_pool(h, i, True, scheme)
        sizes = {n: sm90.run_sizes(f, t, h, i, True, scheme) for n, (f, t) in pool.items()}
        memo = {}

        def pred(name, t):
            if (name, t) not in memo:
                memo[name, t] = cost_model.predict_us(name, t * k, e, *sizes[name], True, k, g, 132)
            return memo[name, t]

        best = {}

        def choice(t):
            if t not in best:
                best[t] = min((pred(n, t), n) for n in pool if pred(n, t) is not None)
            return best[t]

        cells = []
        for n in (8, 16, 32):
            low, either = [], []
            for t in range(257, 8193, 3):
                opt = choice(t)[0]
                lo, hi = points(t, n)
                a = pred(choice(lo)[1], t)
                low.append(a / opt)
                either.append(min(a, pred(choice(hi)[1], t)) / opt)
            for xs in (low, either):
                gm = math.exp(sum(map(math.log, xs)) / len(xs))
                cells.append(f"{gm:.4f} (max {max(xs):.2f})")
        print(f"| {e},{h},{i},{k}{',' + str(g) if g else ''} | {scheme} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
