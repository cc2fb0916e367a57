"""Installed as `sitecustomize` in the end-to-end test's Beam SDK image only, for the test's S3
server: s3s-fs answers a listing without the objects' ETags and a HEAD without a Content-Type
when none was stored, which Beam's S3 client reads (`boto3_client.list`,
`get_object_metadata`). Real S3 servers (AWS, MinIO, Ceph) send them; against s3s-fs defaults
are filled in, through botocore's event hooks on every session (Beam's client makes its own).
"""
try:
    import boto3.session
except ImportError:  # not an S3 pipeline's image
    boto3 = None


def _listed_with_etags(parsed, **_):
    for listed in parsed.get("Contents") or []:
        listed.setdefault("ETag", "")


def _headed_with_defaults(parsed, **_):
    parsed.setdefault("ETag", "")
    parsed.setdefault("ContentType", "application/octet-stream")


if boto3 is not None:
    _new_session = boto3.session.Session.__init__

    def _session_with_etags(self, *args, **kwargs):
        _new_session(self, *args, **kwargs)
        for operation in ("ListObjects", "ListObjectsV2"):
            self.events.register(f"after-call.s3.{operation}", _listed_with_etags)
        self.events.register("after-call.s3.HeadObject", _headed_with_defaults)

    boto3.session.Session.__init__ = _session_with_etags
