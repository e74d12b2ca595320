"""Where a hetu GPU step's time goes: per op family (each op timed alone, the device synchronised
around it, so the figures add up to more than a real step) and the host's profile of real steps.

    python bench/gpu_profile.py --model ncf --batch 65536 --embedding 128 --optimizer sgd

Uses bench/gpu_single.py's data and model set-up."""
import argparse
import collections
import cProfile
import io
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_single  # noqa: E402


def per_op_times(runner, steps):
    import cupy as cp
    ex = runner.executor
    compute = ex._compute
    spent = collections.Counter()
    count = collections.Counter()

    def timed(node, vals, host_vals):
        cp.cuda.get_current_stream().synchronize()
        t = time.perf_counter()
        value = compute(node, vals, host_vals)
        cp.cuda.get_current_stream().synchronize()
        spent[type(node).__name__] += time.perf_counter() - t
        count[type(node).__name__] += 1
        return value
    ex._compute = timed
    for _ in range(steps):
        runner.step()
    ex._compute = compute
    return {k: (v / steps * 1e3, count[k] // steps) for k, v in spent.items()}


def step_ms(runner, steps):
    t = time.perf_counter()
    for _ in range(steps):
        runner.step()
    return (time.perf_counter() - t) / steps * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="ncf", choices=["wdl", "dcn", "ncf"])
    p.add_argument("--batch", type=int, default=65536)
    p.add_argument("--embedding", type=int, default=128)
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    device = gpu_single.Device("gpu")
    data = gpu_single.make_data(args.model, 4 * args.batch)
    print(f"# {args.model} batch {args.batch} embedding {args.embedding} {args.optimizer}")
    for graph in (False, True):
        runner = gpu_single.HetuRunner(args.model, data, args.batch, args.embedding, args.optimizer, device, 2,
                                       cuda_graph=graph)
        for _ in range(4):
            runner.step()
        print(f"step, cuda_graph={graph}: {step_ms(runner, args.steps):.2f} ms")
        if not graph:
            print("per op family, synchronised (ms per step, ops per step):")
            for name, (ms, n) in sorted(per_op_times(runner, args.steps).items(), key=lambda kv: -kv[1][0])[:15]:
                print(f"  {name:32s} {ms:8.3f} ms  x{n}")
        prof = cProfile.Profile()
        prof.enable()
        step_ms(runner, args.steps)
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
        print(f"host profile, cuda_graph={graph} ({args.steps} steps):")
        print("\n".join(out.getvalue().splitlines()[6:24]))
        runner.close()


if __name__ == "__main__":
    main()
