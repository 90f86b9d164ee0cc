"""Benchmark: what identifying an input by content costs (data/stamp.py file_identity).

    python tests/benchmarks/bench_stamp.py [--gib 1] [--rounds 3] [--dir /tmp]

Writes a file of --gib GiB of random bytes (a model.safetensors-sized input) and times, per round:
- hash: its identity with an empty hash cache, i.e. a SHA-256 of the whole file. The file was just
  written, so it is read from the page cache: this is the hashing itself, not the disk (a cold read
  adds the disk's time, which no code can save);
- cached: the identity again, from the cache (one stat and a look-up: what every later run pays);
- touched: after `touch` (a new mtime and ctime), hashed again and found the same.
Prints the medians and the hash's throughput. The file and the cache are deleted at the end.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from data import stamp as stamps  # noqa: E402


def timed(fn):
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        os.environ[stamps.HASH_CACHE_ENV] = str(Path(tmp) / "file_hashes.json")
        path, size = Path(tmp) / "input.bin", int(args.gib * 2**30)
        block = os.urandom(64 << 20)
        with open(path, "wb") as f:
            for start in range(0, size, len(block)):
                f.write(block[:size - start])
        rows = {"hash": [], "cached": [], "touched": []}
        for _ in range(args.rounds):
            Path(os.environ[stamps.HASH_CACHE_ENV]).unlink(missing_ok=True)
            stamps._caches.clear()
            t, first = timed(lambda: stamps.file_identity(path))
            rows["hash"].append(t)
            t, again = timed(lambda: stamps.file_identity(path))
            rows["cached"].append(t)
            os.utime(path)
            t, touched = timed(lambda: stamps.file_identity(path))
            rows["touched"].append(t)
            assert first == again == touched
        hash_s = statistics.median(rows["hash"])
        print(f"{args.gib:g} GiB, {args.rounds} rounds (median, per round {', '.join(f'{t:.2f}' for t in rows['hash'])} s): "
              f"hash {hash_s:.2f} s ({size / hash_s / 2**20:,.0f} MiB/s), "
              f"cached {statistics.median(rows['cached']) * 1e3:.2f} ms, "
              f"touched {statistics.median(rows['touched']):.2f} s")


if __name__ == "__main__":
    main()
