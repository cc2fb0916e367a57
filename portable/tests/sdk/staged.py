"""Files staged with a job reach its PROCESS harnesses: a module given with --files_to_stage is
imported by the user's code on the harness from the harness's `staged` directory (the
submitter's copy is on the submitter's path only), and --save_main_session's file is loaded.
Usage: staged.py JOB_ENDPOINT PYTHON DIR"""
import os
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

HELPER = '''import os


def mark(x):
    """x doubled, and the name of the directory this module was imported from."""
    return x * 2, os.path.basename(os.path.dirname(os.path.abspath(__file__)))
'''


def main(endpoint, python, scratch):
    src = os.path.join(scratch, "src")
    os.makedirs(src, exist_ok=True)
    helper = os.path.join(src, "rb_staged_helper.py")
    with open(helper, "w") as f:
        f.write(HELPER)
    sys.path.insert(0, src)
    import rb_staged_helper  # pickled by reference: the harness must import it itself

    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=PROCESS",
        f'--environment_config={{"command": "{python} -m apache_beam.runners.worker.sdk_worker_main"}}',
        f"--files_to_stage={helper}", "--save_main_session",
    ])
    with beam.Pipeline(options=options) as p:
        marked = p | beam.Create([1, 2, 3]) | beam.Map(lambda x: rb_staged_helper.mark(x))
        assert_that(marked, equal_to([(2, "staged"), (4, "staged"), (6, "staged")]))
    print("staged: ok")


if __name__ == "__main__":
    main(*sys.argv[1:])
