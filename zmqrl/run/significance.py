"""Welch's t-test, for PBT's "t-test selection" (Jaderberg et al. 2017, section 4.1).

A member in the bottom of a population ranked by return copies a donor only when the
donor's recent episodes are better than its own beyond what their spread explains: the
one-sided confidence that the donor's mean return is above the recipient's, by Welch's
t-test over the episodes each reported (mean, sample standard deviation, count). Ranked
by a mean of 20 episodes alone, members on a plateau (CartPole's ~100-150 early on,
Breakout at chance) swap places by noise at every ready point and the truncation copies
whoever is ahead by luck; the rule keeps them on their own weights until one is ahead.

Plain Python (``math.lgamma``): the Student t CDF is integrated by Simpson's rule
(within 1e-6 of scipy's for df >= 1), without making scipy a dependency.
"""

from __future__ import annotations

import math

_SIMPSON_STEPS = 400  # even


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` >= 1 degrees of freedom (Welch's are at
    least the smaller sample's count less one). With x = sqrt(df) tan(u) the density
    becomes c cos(u)^(df - 1) over the finite interval [0, atan(t / sqrt(df))]: smooth
    and bounded for df >= 1, so Simpson's rule needs no cut-off of the tail."""
    if not df >= 1 or math.isnan(t):
        raise ValueError(f"student_t_cdf({t}, {df}): needs df >= 1 and a number t")
    if t < 0:
        return 1.0 - student_t_cdf(-t, df)
    norm = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(math.pi)
    end = math.atan(t / math.sqrt(df))
    h = end / _SIMPSON_STEPS
    total = 1.0 + math.cos(end) ** (df - 1)
    for i in range(1, _SIMPSON_STEPS):
        total += (4 if i % 2 else 2) * math.cos(i * h) ** (df - 1)
    return min(1.0, 0.5 + norm * total * h / 3)


def welch_confidence(mean_a: float, std_a: float, n_a: int,
                     mean_b: float, std_b: float, n_b: int) -> float:
    """The one-sided confidence that sample a's population mean is above b's: the t
    distribution's CDF at Welch's t, with the Welch-Satterthwaite degrees of freedom.
    0 when either side has fewer than 2 samples (nothing to judge by); with no spread on
    either side, 1 if a's mean is above, 0.5 if equal, else 0."""
    if n_a < 2 or n_b < 2:
        return 0.0
    va, vb = std_a * std_a / n_a, std_b * std_b / n_b
    if va + vb == 0:
        return 1.0 if mean_a > mean_b else 0.5 if mean_a == mean_b else 0.0
    t = (mean_a - mean_b) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va * va / (n_a - 1) + vb * vb / (n_b - 1))
    return student_t_cdf(t, df)
