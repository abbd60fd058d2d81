"""Re-read `bench burst` JSON written before the bench reported `text_matched`: the
acceptance of the after-burst run against the reference over the probes that wrote the same
text in both (first_divergence), also K-matched, from the saved per-probe step records.
Usage: python scripts/burst_text_matched.py burst.json [more.json ...]"""

from __future__ import annotations

import json
import sys

from gearshift.bench.burst import expand, text_matched


def main() -> None:
    for path in sys.argv[1:]:
        d = json.load(open(path))
        rec = d["step_records"]
        r = text_matched(expand(rec["reference"]), expand(rec["after_burst"]), d["first_divergence"],
                         *d["window"])
        c, ck = r["acceptance_rate"], r["acceptance_rate_k_matched"]
        print(f"{path}: {len(r['probes'])} of {d['probes']} probes; acceptance {c['reference']:.4f} -> "
              f"{c['after_burst']:.4f} (rel {c['rel_diff']:+.4f}); K-matched {ck['reference']:.4f} -> "
              f"{ck['after_burst']:.4f} (rel {ck['rel_diff']:+.4f}, coverage {r['k_matched_coverage']:.3f})")


if __name__ == "__main__":
    main()
