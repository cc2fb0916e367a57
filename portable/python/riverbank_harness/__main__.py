"""python -m riverbank_harness: Beam's SDK harness, its flags and variables unchanged."""
import gc
import logging
import sys

from apache_beam import version
from apache_beam.runners.worker import sdk_worker_main

# Lean chains reach into the harness's internals: installed on the Beam they were tested with.
TESTED = "2.77."

if __name__ == "__main__":
    if version.__version__.startswith(TESTED):
        from riverbank_harness import chains
        chains.install()
    else:
        logging.warning("apache-beam %s: lean chains are for %sx; Beam's harness runs alone",
                        version.__version__, TESTED)
    # What was made before the first bundle (Beam, gRPC, their modules) is never garbage: kept
    # out of the collector's scans. A chain's batch keeps some thousands of objects alive from
    # one transform to the next; a first generation larger than that lets them die young
    # instead of being scanned again and again as survivors (Python's default is 700).
    gc.freeze()
    gc.set_threshold(20_000, 10, 10)
    sdk_worker_main.main(sys.argv)
