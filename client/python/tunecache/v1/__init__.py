# Package for the stubs that gen_stubs.py generates from proto/tunecache/v1/tunecache.proto
# (tunecache_pb2.py, tunecache_pb2_grpc.py); they import each other as `tunecache.v1.*`.
