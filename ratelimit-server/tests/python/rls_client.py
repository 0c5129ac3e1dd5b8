"""A gRPC client of Envoy's rate limit service, built from Envoy's own .proto
files with grpcio and grpcio-tools (none of it written by this project).

Usage: rls_client.py PROTO_ROOT HOST:PORT < scenario.json

PROTO_ROOT is the `proto` directory of the envoy-types crate's sources (it
holds data-plane-api, xds, protoc-gen-validate and googleapis). The scenario
is {"calls": [RateLimitRequest in proto3 JSON, ...], "health": [service
names]}; the answer, printed as one JSON document, is {"responses": [...],
"health": {name: status}}, each response in proto3 JSON as the protobuf
library writes it, or {"error": {"code": ..., "details": ...}}.
"""

import json
import os
import sys
import tempfile

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_tools import protoc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

try:
    from importlib.resources import files as _files

    WELL_KNOWN = str(_files("grpc_tools") / "_proto")
except Exception:  # pragma: no cover - older Pythons
    import pkg_resources

    WELL_KNOWN = pkg_resources.resource_filename("grpc_tools", "_proto")

SERVICE = "envoy.service.ratelimit.v3.RateLimitService"


def load_types(proto_root):
    out = os.path.join(tempfile.mkdtemp(), "rls.pb")
    args = [
        "protoc",
        "-I" + os.path.join(proto_root, "data-plane-api"),
        "-I" + os.path.join(proto_root, "xds"),
        "-I" + os.path.join(proto_root, "protoc-gen-validate"),
        "-I" + os.path.join(proto_root, "googleapis"),
        "-I" + WELL_KNOWN,
        "--include_imports",
        "--descriptor_set_out=" + out,
        "envoy/service/ratelimit/v3/rls.proto",
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc could not compile envoy/service/ratelimit/v3/rls.proto")
    fds = descriptor_pb2.FileDescriptorSet()
    with open(out, "rb") as f:
        fds.ParseFromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for fd in fds.file:
        pool.Add(fd)
    req = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("envoy.service.ratelimit.v3.RateLimitRequest")
    )
    resp = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("envoy.service.ratelimit.v3.RateLimitResponse")
    )
    return req, resp


def main():
    proto_root, target = sys.argv[1], sys.argv[2]
    scenario = json.load(sys.stdin)
    Request, Response = load_types(proto_root)
    channel = grpc.insecure_channel(target)
    should_rate_limit = channel.unary_unary(
        "/" + SERVICE + "/ShouldRateLimit",
        request_serializer=Request.SerializeToString,
        response_deserializer=Response.FromString,
    )
    responses = []
    for call in scenario.get("calls", []):
        request = json_format.ParseDict(call, Request())
        try:
            response = should_rate_limit(request, timeout=10)
            responses.append(
                json_format.MessageToDict(response, preserving_proto_field_name=False)
            )
        except grpc.RpcError as e:
            responses.append({"error": {"code": e.code().name, "details": e.details()}})
    health = {}
    stub = health_pb2_grpc.HealthStub(channel)
    for name in scenario.get("health", []):
        try:
            r = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
            health[name] = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
        except grpc.RpcError as e:
            health[name] = e.code().name
    channel.close()
    json.dump({"responses": responses, "health": health}, sys.stdout)


if __name__ == "__main__":
    main()
