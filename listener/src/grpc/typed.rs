//! Typed gRPC services, made from the group's event schemas at run time
//! (`api::proto`, decision 0064): `/demo.v1.Basics/Hello` takes a
//! `demo.v1.Hello` message, which is transcoded to the event's JSON
//! fields, sent as the same request event `Events/Call` sends, and its
//! JSON reply transcoded into `demo.v1.HelloReply`. `Notifications/<Type>`
//! streams a notification type as typed messages. Reflection lists them.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes};
use futures_util::StreamExt;
use prost::Message as _;
use prost_reflect::{DeserializeOptions, DynamicMessage, MessageDescriptor, SerializeOptions};
use switchyard_proto::api::Catalog;
use switchyard_proto::grpc::events_server::Events;
use switchyard_proto::grpc::{CallReply, CallRequest, SubscribeRequest};
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::{ServerStreamingService, UnaryService};

use super::{BoxStream, EventsService, GrpcBody, call};
use crate::api::proto;
use crate::context::Opener;
use crate::state::State;

/// One typed rpc, resolved.
pub(crate) struct Rpc {
    event: String,
    input: MessageDescriptor,
    output: MessageDescriptor,
    stream: bool,
}

/// The typed services of one configuration generation.
pub(crate) struct Typed {
    rpcs: HashMap<String, Arc<Rpc>>,
    /// The encoded `FileDescriptorSet`, for reflection.
    pub(crate) descriptors: Vec<u8>,
}

impl Typed {
    /// The services of `catalog`; `None` when it declares no request or
    /// notification type.
    pub(crate) fn new(catalog: &Catalog) -> Result<Option<Typed>, String> {
        let (files, methods) = proto::files(catalog);
        if methods.is_empty() {
            return Ok(None);
        }
        let (pool, descriptors) = proto::compile(&files)?;
        let mut rpcs = HashMap::new();
        for m in methods {
            let find = |name: &str| {
                pool.get_message_by_name(name)
                    .ok_or_else(|| format!("no message {name} in the generated descriptors"))
            };
            rpcs.insert(
                m.path,
                Arc::new(Rpc {
                    event: m.event,
                    input: find(&m.input)?,
                    output: find(&m.output)?,
                    stream: m.stream,
                }),
            );
        }
        Ok(Some(Typed { rpcs, descriptors }))
    }

    /// Serves `req` if its path names a typed rpc.
    pub(crate) async fn serve(
        &self,
        state: &Arc<State>,
        req: http::Request<GrpcBody>,
    ) -> Option<http::Response<tonic::body::Body>> {
        let rpc = self.rpcs.get(req.uri().path())?.clone();
        let mut grpc = tonic::server::Grpc::new(RawCodec);
        let state = state.clone();
        Some(if rpc.stream {
            grpc.server_streaming(Stream { state, rpc }, req).await
        } else {
            grpc.unary(Unary { state, rpc }, req).await
        })
    }
}

/// A message as the event's JSON, 64-bit integers as numbers. A field
/// without presence is always there (a client that leaves one out sends
/// its protobuf default, which validation judges); an `optional` one the
/// client did not set is left out, so the event's serde default applies.
fn to_json(message: &DynamicMessage) -> Result<Vec<u8>, Status> {
    let mut out = serde_json::Serializer::new(Vec::new());
    message
        .serialize_with_options(
            &mut out,
            &SerializeOptions::new()
                .skip_default_fields(false)
                .stringify_64_bit_integers(false),
        )
        .map_err(|e| Status::internal(format!("cannot transcode the message: {e}")))?;
    Ok(out.into_inner())
}

/// A JSON reply as message `output`; fields it does not know are dropped.
fn from_json(output: &MessageDescriptor, json: &[u8]) -> Result<Bytes, Status> {
    if json.is_empty() || output.full_name() == "google.protobuf.Empty" {
        return Ok(Bytes::new());
    }
    let mut de = serde_json::Deserializer::from_slice(json);
    let message = DynamicMessage::deserialize_with_options(
        output.clone(),
        &mut de,
        &DeserializeOptions::new().deny_unknown_fields(false),
    )
    .map_err(|e| Status::internal(format!("the reply does not fit {}: {e}", output.full_name())))?;
    Ok(message.encode_to_vec().into())
}

/// A reply of any content type as a `google.api.HttpBody`.
fn http_body(output: &MessageDescriptor, reply: CallReply) -> Bytes {
    let mut message = DynamicMessage::new(output.clone());
    message.set_field_by_name("content_type", prost_reflect::Value::String(reply.content_type));
    message.set_field_by_name("data", prost_reflect::Value::Bytes(reply.payload));
    message.encode_to_vec().into()
}

#[derive(Clone)]
struct Unary {
    state: Arc<State>,
    rpc: Arc<Rpc>,
}

impl UnaryService<Bytes> for Unary {
    type Response = Bytes;
    type Future = futures_util::future::BoxFuture<'static, Result<tonic::Response<Bytes>, Status>>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let (state, rpc) = (self.state.clone(), self.rpc.clone());
        Box::pin(async move {
            let (metadata, extensions, bytes) = request.into_parts();
            let message = DynamicMessage::decode(rpc.input.clone(), bytes)
                .map_err(|e| Status::invalid_argument(format!("not a {}: {e}", rpc.input.full_name())))?;
            let payload = to_json(&message)?;
            let opener = Opener::of(&metadata.into_headers(), &extensions, &state.pool.routes());
            let mut request = CallRequest {
                r#type: rpc.event.clone(),
                content_type: "application/json".to_owned(),
                payload: payload.into(),
                deadline_ms: 0,
            };
            super::deadline::tighten(&mut request, extensions.get());
            let reply = call(&state, request, &opener.front(&opener.client))
                .await
                .map_err(|e| e.grpc)?;
            if rpc.output.full_name() == proto::HTTP_BODY {
                return Ok(tonic::Response::new(http_body(&rpc.output, reply)));
            }
            from_json(&rpc.output, &reply.payload).map(tonic::Response::new)
        })
    }
}

#[derive(Clone)]
struct Stream {
    state: Arc<State>,
    rpc: Arc<Rpc>,
}

impl ServerStreamingService<Bytes> for Stream {
    type Response = Bytes;
    type ResponseStream = BoxStream<Bytes>;
    type Future = futures_util::future::BoxFuture<'static, Result<tonic::Response<BoxStream<Bytes>>, Status>>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let (state, rpc) = (self.state.clone(), self.rpc.clone());
        Box::pin(async move {
            let (metadata, extensions, bytes) = request.into_parts();
            let filter = DynamicMessage::decode(rpc.input.clone(), bytes)
                .map_err(|e| Status::invalid_argument(format!("not a {}: {e}", rpc.input.full_name())))?;
            let filter_json = filter
                .get_field_by_name("filter_json")
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let subscribe = tonic::Request::from_parts(
                metadata,
                extensions,
                SubscribeRequest {
                    pattern: rpc.event.clone(),
                    filter_json,
                },
            );
            let pushes = EventsService { state }.subscribe(subscribe).await?.into_inner();
            let output = rpc.output.clone();
            let typed = pushes.map(move |push| push.and_then(|p| from_json(&output, &p.payload)));
            Ok(tonic::Response::new(Box::pin(typed) as BoxStream<Bytes>))
        })
    }
}

/// Messages as their encoded bytes; the services decode and encode them
/// with their descriptors.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        let len = src.remaining();
        Ok(Some(src.copy_to_bytes(len)))
    }
}
