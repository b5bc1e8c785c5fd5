#!/usr/bin/env python3
"""How many of the MSDeformAttn backward's grad_value reductions merging
would save, on TARGETS.md's encoder sampling locations (one image; the
same generator as ops/bench_inputs_test.go's deformLocations, with
Python's random numbers).

For groups of G consecutive queries of one head, at each level, it counts
the in-map corners and the distinct pixels among them: the fraction of
reductions left if corners meeting on a pixel were summed first. For the
4 queries of a warp it also counts the narrower merges a kernel could do
cheaply: only the same point's corners, and only the same point and
corner. BENCHMARKS.md ("The reductions alone are over the target") quotes
its output. Pure Python, about half a minute.
"""
import math
import random

LEVELS = [(100, 167), (50, 84), (25, 42), (13, 21)]  # (H, W)
M, P = 8, 4


def references():
    """Each query's reference point: the centre of its own pixel, queries
    in level order (an encoder)."""
    refs = []
    for h, w in LEVELS:
        for y in range(h):
            for x in range(w):
                refs.append(((x + 0.5) / w, (y + 0.5) / h))
    return refs


def corners(rng, ref, m):
    """corners[level][point]: the 4 corner pixels (y, x) of each sample of
    query ref for head m, None outside the map."""
    a = 2 * math.pi * m / M
    dx, dy = math.cos(a), math.sin(a)
    s = max(abs(dx), abs(dy))
    dx, dy = dx / s, dy / s
    out = []
    for h, w in LEVELS:
        pts = []
        for p in range(P):
            x = (ref[0] + (dx * (p + 1) + rng.gauss(0, 1)) / w) * w - 0.5
            y = (ref[1] + (dy * (p + 1) + rng.gauss(0, 1)) / h) * h - 0.5
            cs = [None] * 4
            if -1 < x < w and -1 < y < h:
                x0, y0 = math.floor(x), math.floor(y)
                for k in range(4):
                    yy, xx = y0 + (k >> 1), x0 + (k & 1)
                    if 0 <= yy < h and 0 <= xx < w:
                        cs[k] = (yy, xx)
            pts.append(cs)
        out.append(pts)
    return out


def main():
    refs = references()
    for g in (1, 4, 32):
        rng = random.Random(1)
        total = level_any = point_any = point_corner = 0
        for m in range(M):
            for q0 in range(0, len(refs), g):
                cs = [corners(rng, refs[q], m) for q in range(q0, min(q0 + g, len(refs)))]
                for li in range(len(LEVELS)):
                    seen = set()
                    for p in range(P):
                        anyc = set()
                        for k in range(4):
                            same = {c[li][p][k] for c in cs if c[li][p][k] is not None}
                            total += sum(c[li][p][k] is not None for c in cs)
                            point_corner += len(same)
                            anyc |= same
                        point_any += len(anyc)
                        seen |= anyc
                    level_any += len(seen)
        line = f"{g:2d} queries of a head: {total} corner reductions; left after merging any corners of a level {level_any / total:.3f}"
        if g == 4:
            line += f", the same point's corners {point_any / total:.3f}, the same point and corner {point_corner / total:.3f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
