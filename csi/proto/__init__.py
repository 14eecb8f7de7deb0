"""The CSI protocol: csi.proto and the gRPC stubs generated from it (`./dev.sh proto`).

csi_pb2.py (messages), csi_pb2.pyi (their types) and csi_pb2_grpc.py (services) are written by
generate.py and never edited; the driver imports them as `from pffs.csi.proto import csi_pb2`.
"""
