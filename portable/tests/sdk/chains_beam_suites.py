"""Beam's own runner tests with lean chains: the apache-beam wheel's FnApiRunnerTest (and, with
--all, its ptransform, combiners and util tests) run in this process on Beam's FnApiRunner, whose
embedded harness builds its bundle processors with Riverbank's chains installed. Needs
pyhamcrest, parameterized and pytest beside apache-beam (dev/setup.sh). Ends with
`chains_beam_suites: ran N, skipped S, chains C` and a `not passed: NAME` line per failure.
Usage: chains_beam_suites.py HARNESS_PACKAGE_DIR [--all]"""
import importlib
import logging
import sys
import unittest

sys.path.insert(0, sys.argv[1])
from riverbank_harness import chains  # noqa: E402

SUITES = ["apache_beam.runners.portability.fn_api_runner.fn_runner_test:FnApiRunnerTest",
          "apache_beam.transforms.window_test"]
MORE = ["apache_beam.transforms.ptransform_test", "apache_beam.transforms.combiners_test",
        "apache_beam.transforms.util_test"]
# Beam's own tests that fail on the wheel whether or not chains are installed (they read the
# process's stdout, which this runner's report takes).
KNOWN = {"test_stdout_logs", "test_stdout_logs_without_rfc3339",
         "test_setting_level_uses_appropriate_log_channel"}


def main(all_suites):
    chains.install()
    logging.getLogger().setLevel(logging.ERROR)
    loader, suite = unittest.TestLoader(), unittest.TestSuite()
    for name in SUITES + (MORE if all_suites else []):
        module, _, case = name.partition(":")
        module = importlib.import_module(module)
        suite.addTests(loader.loadTestsFromTestCase(getattr(module, case)) if case else
                       loader.loadTestsFromModule(module))
    result = unittest.TextTestRunner(verbosity=1, stream=sys.stdout).run(suite)
    print(f"chains_beam_suites: ran {result.testsRun}, skipped {len(result.skipped)}, "
          f"chains {chains.built}")
    for test, _ in result.failures + result.errors:
        name = test.id().rsplit(".", 1)[-1]
        if name not in KNOWN:
            print(f"not passed: {name}")


if __name__ == "__main__":
    main("--all" in sys.argv[2:])
