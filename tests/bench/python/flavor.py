# Owns what differs between the two Python clients the benchmarks compare: the `tunecache`
# package of today (a binding of the Rust client, `tunecache._native`) and the grpcio package it
# replaced (issue 28's "before", run from its own source tree): how one Scan's raw bytes are
# fetched (with grpcio and the generated stubs, outside either client) and turned into the
# objects that client's Scan returns (the floors' "parse + build"). Prepended by the harness to
# the scripts that need it (`python -c`).
import tunecache


def client_flavor():
    """"binding" for the package over the Rust client, "grpcio" for the one before it."""
    return "binding" if getattr(tunecache, "_native", None) is not None else "grpcio"


def raw_scan_chunks(socket, namespace, device, rank=None):
    """The Scan's response messages as the daemon sent them (bytes), through a grpcio channel
    of the benchmark's own; returns (chunks, channel)."""
    import grpc
    from tunecache.v1 import tunecache_pb2 as pb

    channel = grpc.insecure_channel("unix:" + socket, options=(("grpc.default_authority", "localhost"),))
    raw = channel.unary_stream(
        "/tunecache.v1.TuneCache/Scan",
        request_serializer=pb.ScanRequest.SerializeToString,
        response_deserializer=None,
    )
    return list(raw(pb.ScanRequest(namespace=namespace, device=device, rank=rank), timeout=60)), channel


def decode_scan(chunks):
    """The entries a Scan of these bytes returns, built as that client builds them: the binding
    decodes in Rust and makes its Entry objects; the grpcio package parses with protobuf."""
    native = getattr(tunecache, "_native", None)
    if native is not None:
        return [entry for chunk in native._decode_scan_chunks(chunks) for entry in chunk]
    from tunecache.v1 import tunecache_pb2 as pb

    return [entry for chunk in chunks for entry in pb.ScanResponse.FromString(chunk).entries]
