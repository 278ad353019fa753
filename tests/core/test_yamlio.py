"""lab.core.yamlio's file reader: a YAML file parsed once per version of it, and None for one that cannot be read."""
import os

import pytest

from lab.core.yamlio import read_yaml_file

pytestmark = pytest.mark.unit


def test_a_yaml_file_is_parsed_once_per_version_and_none_when_it_cannot_be(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("kind: evaluate\nlimit: 8\n")
    first = read_yaml_file(path)
    assert first == ("kind: evaluate\nlimit: 8\n", {"kind": "evaluate", "limit": 8})
    assert read_yaml_file(path) is first, "the same version of the file: parsed once"
    stat = path.stat()
    path.write_text("kind: evaluate\nlimit: 9\n")  # the same size: its time tells it apart
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert read_yaml_file(path)[1] == {"kind": "evaluate", "limit": 9}
    path.write_text("kind: [evaluate\n")
    assert read_yaml_file(path) is None, "not YAML"
    path.write_bytes(b"kind: \xff\n")
    assert read_yaml_file(path) is None, "not UTF-8"
    path.write_text("a: &x [1]\nb: *x\n")
    assert read_yaml_file(path) is None, "an alias: refused as load_yaml refuses it"
    path.unlink()
    assert read_yaml_file(path) is None
