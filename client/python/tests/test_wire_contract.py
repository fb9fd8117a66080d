# Owns the wire-contract tests: an independent grpcio client (the tests' own grpcio, with the
# `[grpc]` extra's generated stubs) and the package (the Rust client underneath) against the same
# real daemon: what one records the other reads back field for field, a rank's entry stays a
# rank's, both read in the same view, and the refused entry's index is read the same way from a
# grpcio error and from the package's.
from __future__ import annotations

import time

import pytest

import tunecache
from conftest import unique_key

grpc = pytest.importorskip("grpc")
from tunecache.v1 import tunecache_pb2 as pb  # noqa: E402
from tunecache.v1 import tunecache_pb2_grpc as pb_grpc  # noqa: E402


@pytest.fixture
def stub(daemon):
    channel = grpc.insecure_channel(f"unix:{daemon.socket_path}", options=tunecache.CHANNEL_OPTIONS)
    yield pb_grpc.TuneCacheStub(channel)
    channel.close()


def test_what_the_package_records_grpcio_reads_back_and_the_other_way(daemon, stub):
    ours = unique_key(rank=5)
    theirs = unique_key()
    with daemon.client() as client:
        recorded = client.record([{"key": ours, "result": {"config": '{"a": [1, 2.5]}', "time_us": 12.25,
                                                            "tuned_by": "package", "tuned_at_unix_ms": 1234}}])
        assert (recorded.stored, recorded.unchanged) == (1, 0)
        stub.Record(pb.RecordRequest(entries=[pb.Entry(
            key=pb.Key(namespace=theirs.namespace, op=theirs.op, device=theirs.device, problem=theirs.problem),
            result=pb.Result(config='{"b": "\\u00e9"}', time_us=0.5, tuned_by="grpcio", tuned_at_unix_ms=99))]), timeout=5)
        (seen,) = stub.Lookup(pb.LookupRequest(keys=[pb.Key(namespace=ours.namespace, op=ours.op, device=ours.device,
                                                            problem=ours.problem, rank=5)]), timeout=5).hits
        assert seen.key.HasField("rank") and seen.key.rank == 5
        assert (seen.result.config, seen.result.time_us, seen.result.tuned_by, seen.result.tuned_at_unix_ms) == (
            '{"a": [1, 2.5]}', 12.25, "package", 1234)
        (back,) = client.lookup([theirs])
        assert not back.key.HasField("rank") and back.key.rank == 0
        assert (back.result.config, back.result.time_us, back.result.tuned_by, back.result.tuned_at_unix_ms) == (
            '{"b": "\\u00e9"}', 0.5, "grpcio", 99)
        # A generated message is taken as an argument too.
        assert client.lookup([seen.key])[0].key == ours


def test_a_lease_from_one_client_is_completed_by_the_other(daemon, stub):
    key = unique_key()
    with daemon.client() as client:
        lease = client.resolve(key, wait_ms=0).tune_here
        assert lease.lease_id and lease.expires_in_ms > 0
        stub.Record(pb.RecordRequest(lease_id=lease.lease_id, entries=[pb.Entry(
            key=pb.Key(namespace=key.namespace, op=key.op, device=key.device, problem=key.problem),
            result=pb.Result(config="{}", time_us=1.0))]), timeout=5)
        assert client.resolve(key, wait_ms=0, can_tune=False).WhichOneof("outcome") == "hit"
        assert client.stats().leases_active == 0


def test_both_read_in_the_same_view(daemon, stub, monkeypatch):
    key = unique_key()
    grpc_key = pb.Key(namespace=key.namespace, op=key.op, device=key.device, problem=key.problem)
    monkeypatch.setenv("TUNECACHE_VIEW", "wire-job")
    with daemon.client() as client:
        client.record([{"key": key, "result": {"config": '{"v": 1}', "time_us": 5.0}}])
        assert client.lookup([key])[0].result.config == '{"v": 1}'  # pinned in wire-job
        client.record([{"key": key, "result": {"config": '{"v": 2}', "time_us": 1.0}}])
        in_view = stub.Lookup(pb.LookupRequest(keys=[grpc_key], view="wire-job"), timeout=5).hits
        without = stub.Lookup(pb.LookupRequest(keys=[grpc_key]), timeout=5).hits
        assert [hit.result.config for hit in in_view] == ['{"v": 1}']
        assert [hit.result.config for hit in without] == ['{"v": 2}']


def test_the_refused_index_is_read_the_same_from_either_error(daemon, stub):
    good = pb.Entry(key=pb.Key(namespace="pytest", op="o", device="d", problem=str(time.time())),
                    result=pb.Result(config="{}", time_us=1.0))
    bad = pb.Entry(key=good.key, result=pb.Result(config="{nope", time_us=1.0))
    with pytest.raises(grpc.RpcError) as raw:
        stub.Record(pb.RecordRequest(entries=[good, good, bad]), timeout=5)
    with daemon.client() as client, pytest.raises(tunecache.RpcError) as ours:
        client.record([good, good, bad])
    assert tunecache.refused_entry_index(raw.value) == tunecache.refused_entry_index(ours.value) == 2
    assert raw.value.code() == ours.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raw.value.details() == ours.value.details()
