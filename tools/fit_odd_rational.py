#!/usr/bin/env python3
"""fit_odd_rational.py: fits runtime/cpu/nn_common.h's f32 erf (dt_nn_erff) and checks it.

It is c P(c^2) / Q(c^2) with P, Q of degree 5 (Q(0) = 1) on [0, lim], c = x clamped to [-lim, lim], fitted by
iteratively reweighted least squares on the linearised error x P - f Q (weights 1 / Q and the error's square root,
pushing towards equal ripple). Prints the coefficients (nn_common.h's, up to the last digit: one differs by an f32
ulp) and the largest error of the f32 evaluation (Horner in f32, coefficients rounded to f32) against the f64
function. Needs numpy (python3-numpy).

    python3 tools/fit_odd_rational.py
"""
import math

import numpy as np


def fit(f, lim, deg=5, points=20000, iters=60):
    x = (1 - np.cos(np.linspace(0, np.pi, points))) / 2 * lim + 1e-9
    fx, z = np.array([f(v) for v in x]), x * x
    w, q_prev, best = np.ones_like(x), np.ones_like(x), None
    for _ in range(iters):
        a = np.hstack([np.stack([x * z**k for k in range(deg + 1)], 1),
                       np.stack([-fx * z**k for k in range(1, deg + 1)], 1)])
        s = w / np.abs(q_prev)
        sol = np.linalg.lstsq(a * s[:, None], fx * s, rcond=None)[0]
        p, q = sol[:deg + 1], np.concatenate([[1.0], sol[deg + 1:]])
        q_prev = np.polyval(q[::-1], z)
        err = np.abs(x * np.polyval(p[::-1], z) / q_prev - fx)
        if best is None or err.max() < best[2]:
            best = (p, q, err.max())
        w = w * np.sqrt(err / err.max()) + 1e-12
        w /= w.max()
    return best


def f32_error(f, lim, p, q):
    xs = np.linspace(0, lim + 1, 300001).astype(np.float32)
    c = np.minimum(xs, np.float32(lim))
    z = c * c
    pz, qz = np.full_like(z, np.float32(p[-1])), np.full_like(z, np.float32(q[-1]))
    for k in range(len(p) - 2, -1, -1):
        pz, qz = pz * z + np.float32(p[k]), qz * z + np.float32(q[k])
    r = (c * pz / qz).astype(np.float64)
    return np.abs(r - np.array([f(float(v)) for v in xs])).max()


p, q, err = fit(math.erf, 4.0)  # the defaults (20000 points, 60 iterations) gave nn_common.h's coefficients
print(f"dt_nn_erff: fit on [0, 4] {err:.2e}, f32 evaluation {f32_error(math.erf, 4.0, p, q):.2e}")
print("  p", ", ".join(f"{c:.9e}f" for c in p))
print("  q", ", ".join(f"{c:.9e}f" for c in q))
