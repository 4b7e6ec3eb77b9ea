"""A gRPC client that knows nothing of Switchyard but the server's address.

It finds the typed services by server reflection, builds the message
classes from the descriptors the server sends, calls
`demo.v1.Basics/Hello`, decodes a validation error with the standard
`google.rpc.Status` tooling (grpcio-status), leaves a field with a serde
default unset (`KvIncr.by`), and calls a route that answers bytes
(`PayloadService/Payload`, a `google.api.HttpBody`). Run by
tests/grpc_typed.rs; prints one JSON object.
"""

import json
import sys

import grpc
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message_factory import GetMessageClass
from google.rpc import error_details_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from grpc_status import rpc_status


def unary(channel, pool, service, name):
    """A typed unary rpc found by reflection, and its request class."""
    method = pool.FindServiceByName(service).FindMethodByName(name)
    request_class = GetMessageClass(method.input_type)
    reply_class = GetMessageClass(method.output_type)
    call = channel.unary_unary(
        f"/{service}/{name}",
        request_serializer=request_class.SerializeToString,
        response_deserializer=reply_class.FromString,
    )
    return call, request_class, method


def main(address):
    channel = grpc.insecure_channel(address)
    database = ProtoReflectionDescriptorDatabase(channel)
    services = list(database.get_services())
    pool = DescriptorPool(database)
    method = pool.FindServiceByName("demo.v1.Basics").FindMethodByName("Hello")
    request_class = GetMessageClass(method.input_type)
    reply_class = GetMessageClass(method.output_type)
    hello = channel.unary_unary(
        "/demo.v1.Basics/Hello",
        request_serializer=request_class.SerializeToString,
        response_deserializer=reply_class.FromString,
    )
    reply = hello(request_class(name="Ada"), timeout=10)
    result = {
        "services": services,
        "input": method.input_type.full_name,
        "output": method.output_type.full_name,
        "message": reply.message,
    }
    try:
        hello(request_class(name=""), timeout=10)
        result["error"] = None
    except grpc.RpcError as err:
        status = rpc_status.from_call(err)
        violations = []
        reasons = []
        for detail in status.details:
            if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                violations += [[v.field, v.description] for v in bad.field_violations]
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reasons.append(info.reason)
        result["error"] = {
            "code": err.code().name,
            "violations": violations,
            "reasons": reasons,
        }
    # `by` has a serde default (1): unset, it is left out, as over HTTP.
    incr, incr_request, _ = unary(channel, pool, "demo.v1.Basics", "KvIncr")
    result["incr_default"] = incr(incr_request(key="py-incr"), timeout=10).value
    result["incr_zero"] = incr(incr_request(key="py-incr", by=0), timeout=10).value
    result["incr_five"] = incr(incr_request(key="py-incr", by=5), timeout=10).value
    # A route that answers bytes: a google.api.HttpBody.
    payload, payload_request, method = unary(channel, pool, "demo.v1.PayloadService", "Payload")
    body = payload(payload_request(size=1000), timeout=10)
    result["payload"] = {
        "output": method.output_type.full_name,
        "content_type": body.content_type,
        "length": len(body.data),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
