# Owns the tests of artifacts, the files beside a result (issue 36), against the real tunecached
# (fixture `daemon` in conftest.py): put_artifact, then a Record naming it, then Lookup and
# fetch_artifacts round trip (more than one 1 MiB chunk, an empty file); a result whose named
# digest or size is not the blob's is refused with nothing left behind; a hostile name cannot
# leave the directory; Result.artifacts both ways (constructor, mapping, generated message,
# pickling); get_or_tune and tunecache.autotune storing files beside the config. The rules (names,
# digests, chunking, verification) are the Rust client's; these tests reach them through the
# binding.
from __future__ import annotations

import hashlib
import json
import os
import pickle
import time

import pytest

import tunecache
from conftest import unique_key


def write(path, data: bytes):
    path.write_bytes(data)
    return path


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def recorded(client, key, artifacts, config='{"tile": 64}', time_us=3.0):
    result = tunecache.Result(config=config, time_us=time_us, tuned_by="pytest",
                              tuned_at_unix_ms=int(time.time() * 1000), artifacts=artifacts)
    assert client.record([tunecache.Entry(key=key, result=result)]).stored == 1
    (hit,) = client.lookup([key])
    return hit


def test_put_record_lookup_fetch_round_trip(daemon, tmp_path):
    kernel = os.urandom(1024 * 1024 * 2 + 123)  # three chunks
    source = write(tmp_path / "kernel.cubin", kernel)
    empty = write(tmp_path / "empty", b"")
    with daemon.client() as client:
        stored = client.put_artifact(source)
        assert (stored.sha256, stored.size, stored.already_held) == (sha256(kernel), len(kernel), False)
        # The same bytes again: held already, nothing but the first chunk read.
        assert client.put_artifact(source).already_held
        assert client.stat_artifacts([stored.sha256, sha256(b"never uploaded")]) == [sha256(b"never uploaded")]

        artifacts = [tunecache.Artifact(name="kernel.cubin", sha256=stored.sha256, size=stored.size)]
        artifacts += client.put_artifacts({"empty.txt": empty})
        key = unique_key()
        hit = recorded(client, key, artifacts)
        # In name order, as the daemon keeps them, and as the contract's messages.
        assert [(a.name, a.sha256, a.size) for a in hit.result.artifacts] == [
            ("empty.txt", sha256(b""), 0), ("kernel.cubin", sha256(kernel), len(kernel))]

        out = tmp_path / "out"
        out.mkdir()
        written = client.fetch_artifacts(hit, out)
        assert written == [str(out / "empty.txt"), str(out / "kernel.cubin")]
        assert (out / "kernel.cubin").read_bytes() == kernel
        assert (out / "empty.txt").read_bytes() == b""
        assert sorted(os.listdir(out)) == ["empty.txt", "kernel.cubin"]  # no temporary file left
        # A Result alone is enough, and a second fetch replaces the files.
        (out / "kernel.cubin").write_bytes(b"stale")
        client.fetch_artifacts(hit.result, out)
        assert (out / "kernel.cubin").read_bytes() == kernel

        stats = client.stats()
        assert stats.artifact_uploads >= 2 and stats.artifact_uploads_already_held >= 1


def test_a_wrong_digest_or_size_is_refused_and_nothing_is_left(daemon, tmp_path):
    kernel = b"\x7fELF" + os.urandom(5000)
    other = b"other bytes"
    with daemon.client() as client:
        stored = client.put_artifact(write(tmp_path / "k", kernel))
        held_other = client.put_artifact(write(tmp_path / "o", other))
        out = tmp_path / "out"
        out.mkdir()
        (out / "kernel.bin").write_bytes(b"previous")

        # The size named is not the blob's: refused, the previous file stays, no temporary file.
        wrong_size = tunecache.Result(artifacts=[{"name": "kernel.bin", "sha256": stored.sha256, "size": 12}])
        with pytest.raises(tunecache.ArtifactError, match="12 bytes"):
            client.fetch_artifacts(wrong_size, out)
        assert (out / "kernel.bin").read_bytes() == b"previous"
        assert os.listdir(out) == ["kernel.bin"]

        # A digest the node does not hold: NOT_FOUND, nothing written.
        unknown = tunecache.Result(artifacts=[{"name": "x.bin", "sha256": sha256(b"nobody"), "size": 6}])
        with pytest.raises(tunecache.RpcError) as missing:
            client.fetch_artifacts(unknown, out)
        assert missing.value.code() == tunecache.StatusCode.NOT_FOUND
        assert os.listdir(out) == ["kernel.bin"]

        # A digest that is not one: refused before anything is asked.
        with pytest.raises(tunecache.ArtifactError, match="digest"):
            client.fetch_artifacts(tunecache.Result(artifacts=[{"name": "y", "sha256": "ABC", "size": 1}]), out)

        # The daemon refuses a Record naming a blob it cannot serve, or a size that is not the blob's.
        for artifact in ({"name": "k", "sha256": sha256(b"never uploaded"), "size": 14},
                         {"name": "k", "sha256": held_other.sha256, "size": 999}):
            result = tunecache.Result(config="{}", time_us=1.0, artifacts=[artifact])
            with pytest.raises(tunecache.RpcError) as refused:
                client.record([tunecache.Entry(key=unique_key(), result=result)])
            # Not held: FAILED_PRECONDITION (PutArtifact first); another size: INVALID_ARGUMENT.
            assert refused.value.code() in (tunecache.StatusCode.FAILED_PRECONDITION,
                                            tunecache.StatusCode.INVALID_ARGUMENT)
            assert "artifacts[0]" in refused.value.details()


def test_a_hostile_name_cannot_leave_the_directory(daemon, tmp_path):
    with daemon.client() as client:
        stored = client.put_artifact(write(tmp_path / "k", b"payload"))
        out = tmp_path / "out"
        out.mkdir()
        for name in ("../escape", "/etc/passwd", "..", "a/b", ""):
            result = tunecache.Result(artifacts=[{"name": name, "sha256": stored.sha256, "size": stored.size}])
            with pytest.raises(tunecache.ArtifactError):
                client.fetch_artifacts(result, out)
        assert os.listdir(out) == []
        assert not (tmp_path / "escape").exists()
        # Names are checked before anything is uploaded too.
        with pytest.raises(tunecache.ArtifactError):
            client.put_artifacts({"ok": tmp_path / "k", "../bad": tmp_path / "k"})
        with pytest.raises(FileNotFoundError):
            client.put_artifact(tmp_path / "no-such-file")


def test_result_artifacts_convert_both_ways():
    artifact = tunecache.Artifact(name="a.so", sha256="ab" * 32, size=7)
    result = tunecache.Result(config="{}", artifacts=[artifact, {"name": "b", "sha256": "cd" * 32, "size": 1}])
    assert [a.name for a in result.artifacts] == ["a.so", "b"]
    assert result.artifacts[0] == artifact
    assert "artifacts=[Artifact(name=\"a.so\"" in repr(result)
    assert pickle.loads(pickle.dumps(result)) == result
    result.artifacts = []
    assert result.artifacts == []
    entry = tunecache.Entry(key={"namespace": "n", "op": "o"}, result={"config": "{}", "artifacts": [artifact]})
    assert entry.result.artifacts == [artifact]


def test_a_generated_message_carries_its_artifacts(daemon, tmp_path):
    pb = pytest.importorskip("tunecache.v1.tunecache_pb2")
    with daemon.client() as client:
        stored = client.put_artifact(write(tmp_path / "k", b"from grpcio"))
        key = unique_key()
        message = pb.Entry(key=pb.Key(namespace=key.namespace, op=key.op, device=key.device, problem=key.problem),
                           result=pb.Result(config="{}", time_us=2.0,
                                            artifacts=[pb.Artifact(name="k.bin", sha256=stored.sha256, size=stored.size)]))
        assert client.record([message]).stored == 1
        (hit,) = client.lookup([key])
        assert [(a.name, a.size) for a in hit.result.artifacts] == [("k.bin", 11)]


def test_get_or_tune_stores_files_beside_the_config(daemon, tmp_path):
    built = write(tmp_path / "built.cubin", b"compiled kernel")
    key = unique_key()
    with daemon.client() as client:
        config = client.get_or_tune(key, lambda: ({"block": 128}, 4.0, {"kernel.cubin": built}), fallback=None)
        assert config == {"block": 128}
        (hit,) = client.lookup([key])
        out = tmp_path / "out"
        out.mkdir()
        client.fetch_artifacts(hit, out)
        assert (out / "kernel.cubin").read_bytes() == b"compiled kernel"


def test_autotune_uploads_the_best_configs_files_and_fetches_them(daemon, tmp_path):
    def files_for(config, size):
        path = tmp_path / f"kernel-{config['block']}-{size}.bin"
        path.write_bytes(json.dumps({"block": config["block"], "size": size}).encode())
        return {"kernel.bin": path}

    with daemon.client() as client:
        tuner = tunecache.autotune(
            "pytest-artifacts", f"op-{os.getpid()}-{time.time()}", key_fn=lambda size: {"size": size},
            configs=[{"block": 64}, {"block": 128}], bench=lambda config, size: float(config["block"]),
            device="cpu|pytest", warmup=0, repeats=1, client=client, artifacts=files_for)
        assert tuner.best(7) == {"block": 64}
        out = tmp_path / "out"
        out.mkdir()
        assert tuner.fetch_artifacts(out, 7) == [str(out / "kernel.bin")]
        assert json.loads((out / "kernel.bin").read_text()) == {"block": 64, "size": 7}
        assert tuner.fetch_artifacts(out, 8) == []  # nothing stored for that problem

        # Files that cannot be uploaded: the process uses its own config, nothing is recorded.
        broken = tunecache.autotune(
            "pytest-artifacts", f"broken-{os.getpid()}-{time.time()}", key_fn=lambda size: {"size": size},
            configs=[{"block": 64}], bench=lambda config, size: 1.0, device="cpu|pytest",
            warmup=0, repeats=1, client=client, artifacts={"kernel.bin": tmp_path / "missing"})
        assert broken.best(1) == {"block": 64}
        assert broken.fetch_artifacts(out, 1) == []
