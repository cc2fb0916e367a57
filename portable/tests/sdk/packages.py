"""Packages staged with a job are installed for its PROCESS harnesses, as Beam's container boot
installs them: a wheel given with --extra_package and named in --requirements_file (with
--requirements_cache=skip) is pip-installed with the harness command's Python into a prefix on
the harnesses' path, and the user's code imports it from there (the submitter cannot import it
at all). Usage: packages.py JOB_ENDPOINT PYTHON DIR"""
import base64
import hashlib
import os
import sys
import zipfile

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

NAME, VERSION = "rb_installed_pkg", "0.1"
MODULE = '''import os


def triple(x):
    """x tripled, and whether this module was imported from an installed package."""
    return x * 3, "site-packages" in os.path.abspath(__file__)
'''


def wheel(into):
    """A pure-Python wheel of NAME, written by hand (no build tools needed)."""
    info = f"{NAME}-{VERSION}.dist-info"
    files = {
        f"{NAME}/__init__.py": MODULE,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: riverbank-test\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    path = os.path.join(into, f"{NAME}-{VERSION}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def main(endpoint, python, scratch):
    try:
        __import__(NAME)
        raise SystemExit(f"{NAME} must not be importable by the submitter")
    except ImportError:
        pass
    whl = wheel(scratch)
    requirements = os.path.join(scratch, "requirements.txt")
    with open(requirements, "w") as f:
        f.write(f"{NAME}=={VERSION}\n")
    options = PipelineOptions([
        "--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=PROCESS",
        f'--environment_config={{"command": "{python} -m apache_beam.runners.worker.sdk_worker_main"}}',
        "--sdk_worker_parallelism=2",
        f"--extra_package={whl}", f"--requirements_file={requirements}",
        "--requirements_cache=skip",
    ])
    with beam.Pipeline(options=options) as p:
        tripled = p | beam.Create([1, 2, 3]) | beam.Map(lambda x: __import__(NAME).triple(x))
        assert_that(tripled, equal_to([(3, True), (6, True), (9, True)]))
    print("packages: ok")


if __name__ == "__main__":
    main(*sys.argv[1:])
