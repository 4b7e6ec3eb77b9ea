//! A typed gRPC client that knows only the wire format: messages are
//! encoded and read field by field, by the numbers the group's `.proto`
//! gives them (`switchyard_listener::api::proto::field_numbers`), and
//! sent with the [`Raw`] codec, as a client generated from that `.proto`
//! would send them.

use std::net::SocketAddr;

use bytes::Bytes;
use futures_util::StreamExt;
use tonic::transport::Channel;

use super::PATIENCE;
use super::raw_codec::Raw;

/// A protobuf value as a client that knows only the wire format reads it.
#[derive(Clone, Debug, PartialEq)]
pub enum Wire {
    Varint(u64),
    Bytes(Vec<u8>),
}

impl Wire {
    /// The value as text (a string field).
    pub fn text(&self) -> Option<String> {
        match self {
            Wire::Bytes(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Wire::Varint(_) => None,
        }
    }
}

/// Reads a varint off the front of `buf`.
pub fn varint(buf: &mut &[u8]) -> u64 {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = buf[0];
        *buf = &buf[1..];
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
    }
    value
}

pub fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// The fields of an encoded message in their order, a repeated field once
/// per value (varints and length-delimited values: a double or a fixed
/// field, which no integer should be, fails the test).
pub fn fields(mut buf: &[u8]) -> Vec<(u32, Wire)> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let key = varint(&mut buf);
        let number = u32::try_from(key >> 3).expect("a field number");
        match key & 7 {
            0 => out.push((number, Wire::Varint(varint(&mut buf)))),
            2 => {
                let len = usize::try_from(varint(&mut buf)).expect("a length");
                out.push((number, Wire::Bytes(buf[..len].to_vec())));
                buf = &buf[len..];
            }
            other => panic!("wire type {other} for field {number}: not a varint or length-delimited"),
        }
    }
    out
}

/// The first value of field `number`.
pub fn field(fields: &[(u32, Wire)], number: u32) -> Option<&Wire> {
    fields.iter().find(|(k, _)| *k == number).map(|(_, v)| v)
}

/// A message of `fields`, in that order.
pub fn message(fields: &[(u32, Wire)]) -> Bytes {
    let mut out = Vec::new();
    for (number, value) in fields {
        match value {
            Wire::Varint(v) => {
                put_varint(&mut out, u64::from(*number) << 3);
                put_varint(&mut out, *v);
            }
            Wire::Bytes(b) => {
                put_varint(&mut out, (u64::from(*number) << 3) | 2);
                put_varint(&mut out, b.len() as u64);
                out.extend_from_slice(b);
            }
        }
    }
    Bytes::from(out)
}

/// A string field's value.
pub fn text(value: &str) -> Wire {
    Wire::Bytes(value.as_bytes().to_vec())
}

pub async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Calls the unary rpc at `path` (`/pkg.v1.Service/Method`) with
/// `request`, within [`PATIENCE`].
pub async fn unary(channel: &Channel, path: &'static str, request: Bytes) -> Result<Bytes, tonic::Status> {
    unary_with(channel, path, tonic::Request::new(request)).await
}

/// [`unary`] with a request that carries metadata of its own.
pub async fn unary_with(
    channel: &Channel,
    path: &'static str,
    request: tonic::Request<Bytes>,
) -> Result<Bytes, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.unwrap();
    let at = http::uri::PathAndQuery::from_static(path);
    tokio::time::timeout(PATIENCE, grpc.unary(request, at, Raw))
        .await
        .unwrap_or_else(|_| panic!("{path}: no answer in time"))
        .map(tonic::Response::into_inner)
}

/// Opens the server-streaming rpc at `path` with `request`.
pub async fn server_stream(channel: &Channel, path: &'static str, request: Bytes) -> tonic::Streaming<Bytes> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.unwrap();
    let at = http::uri::PathAndQuery::from_static(path);
    tokio::time::timeout(
        PATIENCE,
        grpc.server_streaming(tonic::Request::new(request), at, Raw),
    )
    .await
    .unwrap_or_else(|_| panic!("{path}: no answer in time"))
    .unwrap()
    .into_inner()
}

/// The next message of `stream`, within [`PATIENCE`].
pub async fn next_message(stream: &mut tonic::Streaming<Bytes>) -> Bytes {
    tokio::time::timeout(PATIENCE, stream.next())
        .await
        .expect("a message in time")
        .expect("the stream goes on")
        .unwrap()
}
