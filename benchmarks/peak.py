"""The measured matmul ceiling of this machine: GFLOP/s of large square matmuls through jax (median of repeats).

    python benchmarks/peak.py [--repeats=N] [--quick]

The measurement is txjax.ops.peak.measure (variants and formula there), here over every size: CPU n = 1024, 2048,
4096; GPU 8192, 16384. The peak of a dtype (used as the MFU denominator by benchmarks/train.py, which
prefers results/peak_PLATFORM.json to the training loop's quick cached measurement) is the best median over sizes.
"""

from __future__ import annotations

import argparse

import common  # first: puts the repo on sys.path

from txjax.ops.peak import measure


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, help="timed calls per size and variant (default 20, quick 5)")
    parser.add_argument("--quick", action="store_true", help="one size, 5 repeats")
    parser.add_argument("--out", help="JSON path (default benchmarks/results/peak_PLATFORM.json)")
    args = parser.parse_args()
    common.warn_if_loaded()
    result = measure(args.quick, args.repeats)
    print(common.table(result["rows"]))
    print(f"peak GFLOP/s: {result['peak_gflops']}")
    print(f"wrote {common.save('peak', result, args.out)}")


if __name__ == "__main__":
    main()
