"""The generated wire v1 modules are what the .proto files say."""

from pathlib import Path

from reactor_serve.protocol.wire_v1 import regenerate


def test_regenerating_from_the_protos_changes_nothing(tmp_path):
    regenerate.generate(tmp_path)
    generated = sorted((tmp_path / "reactor_serve" / "protocol" / "wire_v1").iterdir())
    names = [path.name for path in generated]
    assert len(names) == 2 * len(regenerate.proto_files())
    for path in generated:
        kept = regenerate.PROTO_DIR / path.name
        assert kept.exists(), f"{path.name} is generated but not kept in the repository"
        assert kept.read_bytes() == path.read_bytes(), f"{path.name} differs: run `python -m reactor_serve.protocol.wire_v1.regenerate`"


def test_every_proto_has_its_modules():
    for proto in regenerate.proto_files():
        assert (proto.parent / f"{proto.stem}_pb2.py").exists()
        assert Path(proto.parent / f"{proto.stem}_pb2.pyi").exists()
