"""Beam's own runner tests against Riverbank: `PortableRunnerTest` from the apache-beam wheel (the
FnApiRunnerTest cases Beam runs against every portable job service), its user code on LOOPBACK
harnesses. Needs pyhamcrest, tenacity, parameterized and pytest beside apache-beam (dev/setup.sh).
Prints unittest's report; ends with `validates_runner: ran N` and one `not passed: NAME` line
per test that failed or erred.
With --process, the user code runs on PROCESS harnesses (Beam's harness command, which the job
server starts as Riverbank's, with lean chains) instead.
Usage: validates_runner.py JOB_ENDPOINT [--streaming] [--process] [NAME_PART...]"""
import logging
import sys
import unittest

from apache_beam.options.pipeline_options import PortableOptions, StandardOptions
from apache_beam.runners.portability import portable_runner_test

ENDPOINT = sys.argv[1]


class RiverbankTest(portable_runner_test.PortableRunnerTest):
    @classmethod
    def _create_job_endpoint(cls):
        return ENDPOINT

    def create_options(self):
        options = super().create_options()
        options.view_as(PortableOptions).environment_type = "LOOPBACK"
        return options


class RiverbankProcessTest(RiverbankTest):
    def create_options(self):
        options = super().create_options()
        portable = options.view_as(PortableOptions)
        portable.environment_type = "PROCESS"
        portable.environment_config = (
            '{"command": "%s -m apache_beam.runners.worker.sdk_worker_main"}' % sys.executable)
        return options

    def test_batch_rebatch_pardos(self):
        raise unittest.SkipTest(
            "asserts a warning the harness gives in the test's own process: LOOPBACK only")


class Streaming:
    """The same tests with `--streaming`, as Beam's FlinkRunnerTestStreaming runs them: every
    pipeline a streaming job, run in rounds."""

    def create_options(self):
        options = super().create_options()
        options.view_as(StandardOptions).streaming = True
        return options


class RiverbankStreamingTest(Streaming, RiverbankTest):
    pass


class RiverbankStreamingProcessTest(Streaming, RiverbankProcessTest):
    pass


def main(only):
    logging.getLogger().setLevel(logging.ERROR)
    streaming, process = "--streaming" in only, "--process" in only
    only = [o for o in only if o not in ("--streaming", "--process")]
    case = {
        (False, False): RiverbankTest,
        (True, False): RiverbankStreamingTest,
        (False, True): RiverbankProcessTest,
        (True, True): RiverbankStreamingProcessTest,
    }[(streaming, process)]
    suite = unittest.TestLoader().loadTestsFromTestCase(case)
    if only:
        suite = unittest.TestSuite([t for t in suite if any(p in t.id() for p in only)])
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    print(f"validates_runner: ran {result.testsRun}, skipped {len(result.skipped)}")
    for test, _ in result.failures + result.errors:
        print(f"not passed: {test.id().rsplit('.', 1)[-1]}")


if __name__ == "__main__":
    main(sys.argv[2:])
