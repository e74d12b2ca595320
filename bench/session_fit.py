"""Fit the synthetic generator's session mode to a real log read in time order.

Reads MovieLens ratings (``u.data``: user, item, rating, timestamp, tab separated), sorts them
by timestamp (stable) and measures the reuse distances of the user stream: for each rating of a
user seen before, the ratings since that user's previous one. The session model
(``hetu.data.synthetic.OpenSessions``: a geometric session length, a few concurrent sessions, a
switch probability between them; users drawn from the generator's Zipf law) is then fitted to
them by a grid search minimising the L1 distance between the two reuse-distance histograms on
power-of-two bins. The synthetic stream has the real stream's length, users and items, so the
fitted parameters carry over as the defaults of ``SyntheticSpec``. Items stay independent Zipf
draws in the model; their distances and the rows stream (users and items together, as a
worker's cache sees them) are shown for comparison. Deterministic: fixed seeds, fixed grid.

    python bench/session_fit.py data/ml-100k/u.data --plot docs/session_fit.png
"""
import argparse
import itertools
from dataclasses import replace

import numpy as np

from hetu.data import reuse_distances
from hetu.data.synthetic import OpenSessions, SyntheticSpec, zipf_cdf

LENGTHS = (10, 20, 30, 50, 70, 100, 150, 200, 300, 500)
CONCURRENT = (1, 2, 3, 4, 6, 8, 12)
SWITCHES = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5)
WINDOWS = (256, 1024, 4096)
QUANTILES = (0.5, 0.9, 0.95, 0.99)


def read_time_ordered(path):
    """(users, items) of a ratings file in timestamp order, both numbered densely from 0."""
    table = np.loadtxt(path, dtype=np.int64, usecols=(0, 1, 3))
    order = np.argsort(table[:, 2], kind="stable")
    users = np.unique(table[:, 0], return_inverse=True)[1][order]
    items = np.unique(table[:, 1], return_inverse=True)[1][order]
    return users, items


def zipf_ids(rng, size, exponent, n, permutation):
    ranks = np.minimum(np.searchsorted(zipf_cdf(size, exponent), rng.random(n), side="right"),
                       size - 1)
    return permutation[ranks]


def synthetic_stream(num_users, num_items, n, spec, seed=0):
    """(users, items) as the generator makes them for a 2-field user/item shape with these
    sizes: users from sessions when ``spec.sessions``, else independent; items independent."""
    rng = np.random.default_rng(seed)
    user_perm, item_perm = rng.permutation(num_users), rng.permutation(num_items)
    items = zipf_ids(rng, num_items, spec.zipf_exponent, n, item_perm)
    if not spec.sessions:
        return zipf_ids(rng, num_users, spec.zipf_exponent, n, user_perm), items
    sessions = OpenSessions(spec, lambda r, rows: zipf_ids(r, num_users, spec.zipf_exponent,
                                                            len(rows), user_perm)[:, None], rng)
    return sessions.next_ids(rng, 0, n)[:, 0], items


BINS = 2.0 ** np.arange(0, 19)


def histogram(distances):
    counts = np.histogram(distances, bins=BINS)[0]
    return counts / max(counts.sum(), 1)


def fit(users, items, base):
    """The grid point whose user reuse histogram is nearest (L1) to the real one."""
    target = histogram(reuse_distances(users))
    best = None
    for length, concurrent, switch in itertools.product(LENGTHS, CONCURRENT, SWITCHES):
        if concurrent == 1 and switch != SWITCHES[0]:
            continue            # one session: the switch changes nothing
        spec = replace(base, sessions=True, session_length=length,
                       concurrent_sessions=concurrent, session_switch=switch)
        synthetic_users, _ = synthetic_stream(users.max() + 1, items.max() + 1, len(users), spec)
        distance = np.abs(histogram(reuse_distances(synthetic_users)) - target).sum()
        if best is None or distance < best[0]:
            best = (distance, spec)
    return best


def describe(name, distances, n):
    quantiles = np.quantile(distances, QUANTILES) if len(distances) else [np.nan] * len(QUANTILES)
    shares = [np.mean(distances <= w) if len(distances) else 0.0 for w in WINDOWS]
    return (f"{name:<28}{len(distances) / n:>7.3f}" + "".join(f"{q:>8.0f}" for q in quantiles)
            + "".join(f"{s:>8.3f}" for s in shares))


def plot(path, streams):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(1, 3, figsize=(12, 3.6), sharey=True)
    centres = np.sqrt(BINS[:-1] * BINS[1:])
    for ax, part in zip(axes, ("users", "items", "rows (users + items)")):
        for (label, style), distances in streams[part].items():
            ax.plot(centres, histogram(distances), style, label=label, drawstyle="steps-mid")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_ylim(1e-5, 1.5)
        ax.set_title(part)
        ax.set_xlabel("reuse distance (samples)")
    axes[0].set_ylabel("share of reuses (power-of-two bins)")
    axes[0].legend(fontsize=8)
    figure.suptitle("MovieLens 100K in time order vs the synthetic generator", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=80)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ratings", help="MovieLens u.data (user, item, rating, timestamp; tab separated)")
    p.add_argument("--plot", help="write the reuse-distance histograms to this PNG")
    args = p.parse_args()

    users, items = read_time_ordered(args.ratings)
    n = len(users)
    base = SyntheticSpec(shape="movielens", scale=1.0)
    distance, fitted = fit(users, items, base)
    print(f"{n:,} ratings, {users.max() + 1} users, {items.max() + 1} items; user law Zipf "
          f"{base.zipf_exponent}")
    print(f"fit: session_length {fitted.session_length}, concurrent_sessions "
          f"{fitted.concurrent_sessions}, session_switch {fitted.session_switch} "
          f"(L1 distance of user reuse histograms {distance:.3f})")
    independent_users, independent_items = synthetic_stream(users.max() + 1, items.max() + 1, n, base)
    session_users, session_items = synthetic_stream(users.max() + 1, items.max() + 1, n, fitted)
    sources = {("MovieLens 100K, time order", "k-"): (users, items),
               ("synthetic, sessions (fit)", "C3-"): (session_users, session_items),
               ("synthetic, independent", "C0--"): (independent_users, independent_items)}
    streams = {part: {} for part in ("users", "items", "rows (users + items)")}
    for key, (u, i) in sources.items():
        streams["users"][key] = reuse_distances(u)
        streams["items"][key] = reuse_distances(i)
        streams["rows (users + items)"][key] = reuse_distances(np.stack([u, i + users.max() + 1], 1))
    header = f"{'stream':<28}{'reuse':>7}" + "".join(f"{'q' + format(q, 'g'):>8}" for q in QUANTILES) \
        + "".join(f"{'<=' + str(w):>8}" for w in WINDOWS)
    for part, by_source in streams.items():
        print(f"\n{part}: share of lookups that are reuses, reuse-distance quantiles, share of reuses "
              f"within a window")
        print(header)
        for (label, _), distances in by_source.items():
            print(describe(label, distances, n * (2 if part.startswith("rows") else 1)))
    if args.plot:
        plot(args.plot, streams)
        print(f"\nwrote {args.plot}")


if __name__ == "__main__":
    main()
