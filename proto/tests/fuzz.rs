//! Property tests of every decoder a peer or a client can feed that lives
//! in this crate (decision 0099): frames and their envelopes, control messages,
//! subscription patterns and filters, the WebSocket binary request, and the
//! frame reader over a real socket. Random and mutated inputs, a few
//! hundred cases each (seconds, not minutes). Two properties: no input
//! panics, and none makes a decoder allocate out of proportion to it (a
//! counting allocator measures the peak of each decode).
//!
//! Failures are kept by proptest in `proptest-regressions/` beside this file.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use proptest::prelude::*;
use serde_json::Value;
use switchyard_proto::control::{
    Control, DeclaredType, Filter, HandledType, HttpRoute, ManagerDescription, ManagerHealth, RequestNeeds,
    RouteEntry, RouteTable, TypeNeeds,
};
use switchyard_proto::control::{WsBinaryRequest, pattern_prefix};
use switchyard_proto::frame::{self, DEFAULT_MAX_FRAME};
use switchyard_proto::{
    Deadline, Envelope, EventType, Kind, Meta, Origin, Payload, RequestContext, RequestId, TraceContext,
    codec,
};

#[path = "support/counting.rs"]
mod counting;

use counting::bounded;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn short_string() -> impl Strategy<Value = String> {
    "[a-z0-9.*_-]{0,12}"
}

fn meta() -> impl Strategy<Value = Meta> {
    prop::collection::vec((short_string(), ".{0,16}"), 0..6).prop_map(Meta)
}

/// A request context as the listener makes them: a made or a client's id,
/// a trace or none.
fn request_context() -> impl Strategy<Value = RequestContext> {
    let id = prop_oneof![
        Just(None),
        any::<u128>().prop_map(|v| Some(RequestId::Made(v))),
        "[!-~]{1,128}".prop_map(|text| RequestId::given(text.as_bytes())),
    ];
    let trace = prop_oneof![
        Just(None),
        (1..=u128::MAX, 1..=u64::MAX, any::<u8>()).prop_map(|(trace, span, flags)| Some(TraceContext {
            trace_id: trace.to_be_bytes(),
            span_id: span.to_be_bytes(),
            flags,
        })),
    ];
    (id, trace).prop_map(|(request_id, trace)| RequestContext { request_id, trace })
}

fn envelope() -> impl Strategy<Value = Envelope> {
    let kind = prop_oneof![
        Just(Kind::Request),
        Just(Kind::Notification),
        Just(Kind::Response),
        Just(Kind::StreamItem),
        Just(Kind::Control),
    ];
    let origin = prop_oneof![
        Just(Origin::Unset),
        any::<u64>().prop_map(Origin::Pipe),
        any::<u64>().prop_map(Origin::Manager),
    ];
    (
        any::<u64>(),
        kind,
        any::<u64>(),
        origin,
        any::<u64>(),
        any::<u16>(),
        meta(),
        prop::collection::vec(any::<u8>(), 0..5000),
        request_context(),
    )
        .prop_map(
            |(ty, kind, correlation, origin, deadline, status, meta, body, context)| Envelope {
                event_type: EventType(ty),
                kind,
                correlation,
                origin,
                deadline: Deadline(deadline),
                status,
                token: correlation.rotate_left(17),
                context,
                meta,
                payload: Payload::Inline(Bytes::from(body)),
            },
        )
}

fn description() -> impl Strategy<Value = ManagerDescription> {
    (
        short_string(),
        any::<u32>(),
        prop::collection::vec(any::<u64>(), 0..4),
    )
        .prop_map(|(name, pid, types)| ManagerDescription {
            name: name.clone(),
            pid,
            handles: types
                .iter()
                .map(|&t| HandledType {
                    event_type: EventType(t),
                    name: name.clone(),
                    route: Some(HttpRoute {
                        method: "GET".into(),
                        path: format!("/{name}/{{id}}"),
                        stream_body: t % 2 == 0,
                    }),
                    needs: RequestNeeds {
                        method: t % 3 == 0,
                        headers: if t % 5 == 0 {
                            vec!["x-api-key".into()]
                        } else {
                            Vec::new()
                        },
                        ..RequestNeeds::default()
                    },
                    public: t % 7 != 0,
                })
                .collect(),
            subscribes: types.iter().copied().map(EventType).collect(),
            notifications: types
                .into_iter()
                .map(|t| DeclaredType {
                    name: name.clone(),
                    event_type: EventType(t),
                    public: t % 2 == 0,
                })
                .collect(),
        })
}

fn control() -> impl Strategy<Value = Control> {
    prop_oneof![
        (any::<u32>(), any::<u32>()).prop_map(|(pid, index)| Control::HelloPipe { pid, index }),
        any::<u32>().prop_map(|pid| Control::HelloRouter { pid }),
        description().prop_map(Control::HelloManager),
        any::<u64>().prop_map(|id| Control::Welcome { id }),
        Just(Control::RouterLost),
        (any::<u64>(), any::<u64>(), short_string(), ".{0,32}").prop_map(
            |(session, sub, pattern, filter_json)| {
                Control::Subscribe {
                    session,
                    sub,
                    pattern,
                    filter_json,
                }
            }
        ),
        (any::<u64>(), any::<u64>()).prop_map(|(session, sub)| Control::Unsubscribe { session, sub }),
        any::<u64>().prop_map(|session| Control::SessionClosed { session }),
        Just(Control::Cancel),
        (any::<u64>(), prop::collection::vec(description(), 0..3)).prop_map(|(version, managers)| {
            let mut table = RouteTable {
                version,
                ..RouteTable::default()
            };
            for m in managers {
                for h in m.handles {
                    if !h.needs.is_empty() {
                        table.needs.push(TypeNeeds {
                            event_type: h.event_type,
                            needs: h.needs.clone(),
                        });
                    }
                    if let Some(route) = h.route {
                        table.routes.push(RouteEntry {
                            route,
                            event_type: h.event_type,
                            type_name: h.name,
                            manager: m.name.clone(),
                        });
                    }
                }
                table.managers.push(ManagerHealth {
                    name: m.name,
                    instances_up: m.pid % 3,
                });
            }
            Control::RouteTable(table)
        }),
    ]
}

/// `bytes` with up to 8 bytes flipped, and possibly cut short.
fn mutated(bytes: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = bytes.len().max(1);
    (
        prop::collection::vec((0..len, 1u8..=255), 0..8),
        prop::option::of(0..len),
    )
        .prop_map(move |(flips, cut)| {
            let mut out = bytes.clone();
            for (at, xor) in flips {
                if let Some(b) = out.get_mut(at) {
                    *b ^= xor;
                }
            }
            if let Some(cut) = cut {
                out.truncate(cut);
            }
            out
        })
}

fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        "(eq|ne|in|gt|gte|lt|lte|[a-z]{0,6})".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("(eq|ne|in|gt|gte|lt|lte|[a-z]{0,4})", inner, 0..6)
                .prop_map(|m: BTreeMap<String, Value>| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Parses every whole frame of `bytes` as a reader would, with no
/// descriptors; the first error ends it.
fn parse_all(bytes: &[u8]) {
    let mut buf = bytes::BytesMut::from(bytes);
    while let Ok(Some(len)) = frame::check(&buf, DEFAULT_MAX_FRAME) {
        if frame::parse(buf.split_to(len).freeze(), &mut VecDeque::new()).is_err() {
            return;
        }
    }
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn frames_round_trip(env in envelope()) {
        let bytes = frame::encode(&env, DEFAULT_MAX_FRAME).unwrap();
        let len = frame::check(&bytes, DEFAULT_MAX_FRAME).unwrap().unwrap();
        prop_assert_eq!(len, bytes.len());
        let back = bounded(&bytes, |b| frame::parse(Bytes::copy_from_slice(b), &mut VecDeque::new())).unwrap();
        prop_assert_eq!(back, env);
    }

    /// A context is read back as it was written, and bytes that are not
    /// one (an unknown variant, an id that is not printable, an all-zero
    /// trace or span id, a truncation) are refused with an error.
    #[test]
    fn request_contexts_round_trip_and_garbage_is_refused(
        context in request_context(),
        garbage in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let bytes = codec::encode(&context).unwrap();
        prop_assert_eq!(codec::decode::<RequestContext>(&bytes).unwrap(), context.clone());
        for cut in 0..bytes.len() {
            prop_assert!(codec::decode::<RequestContext>(&bytes[..cut]).is_err());
        }
        if let Ok(back) = codec::decode::<RequestContext>(&garbage) {
            // Whatever decodes is a context the listener could have made.
            if let Some(RequestId::Given(text)) = &back.request_id {
                prop_assert!(RequestId::given(text.as_bytes()).is_some());
            }
            if let Some(trace) = back.trace {
                prop_assert!(trace.trace_id != [0; 16] && trace.span_id != [0; 8]);
            }
        }
    }

    #[test]
    fn random_bytes_never_panic_the_frame_decoder(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        bounded(&bytes, parse_all);
    }

    #[test]
    fn random_bytes_after_a_plausible_prefix_never_panic(
        header_len in 0u32..4096,
        body in prop::collection::vec(any::<u8>(), 0..4096),
        marked in any::<bool>(),
    ) {
        let mut bytes = ((body.len() + 4) as u32).to_le_bytes().to_vec();
        bytes.extend_from_slice(&(header_len | if marked { frame::FD_MARK } else { 0 }).to_le_bytes());
        bytes.extend_from_slice(&body);
        bounded(&bytes, parse_all);
    }

    #[test]
    fn mutated_frames_never_panic(
        bytes in envelope().prop_flat_map(|env| mutated(frame::encode(&env, DEFAULT_MAX_FRAME).unwrap().to_vec()))
    ) {
        bounded(&bytes, parse_all);
    }

    #[test]
    fn truncated_frames_are_incomplete(env in envelope(), cut in any::<prop::sample::Index>()) {
        let bytes = frame::encode(&env, DEFAULT_MAX_FRAME).unwrap();
        let cut = cut.index(bytes.len());
        prop_assert_eq!(frame::check(&bytes[..cut], DEFAULT_MAX_FRAME).unwrap(), None);
    }

    #[test]
    fn control_messages_round_trip(message in control()) {
        let env = Envelope::control(&message).unwrap();
        let bytes = frame::encode(&env, DEFAULT_MAX_FRAME).unwrap();
        let back = frame::parse(bytes.freeze(), &mut VecDeque::new()).unwrap();
        prop_assert_eq!(bounded(&back.payload.clone().into_bytes().unwrap(), |_| back.decode_control()).unwrap(), message);
    }

    #[test]
    fn mutated_control_messages_never_panic(
        bytes in control().prop_flat_map(|c| mutated(codec::encode(&c).unwrap()))
    ) {
        let _ = bounded(&bytes, codec::decode::<Control>);
    }

    #[test]
    fn random_bytes_never_panic_the_control_decoder(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = bounded(&bytes, codec::decode::<Control>);
        let env = Envelope::notification(EventType::CONTROL, Bytes::from(bytes.clone()));
        let _ = bounded(&bytes, |_| env.decode_control());
    }

    #[test]
    fn websocket_binary_requests_never_panic(
        bytes in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..2048),
            (short_string(), short_string(), prop::collection::vec(any::<u8>(), 0..256))
                .prop_flat_map(|(id, event_type, payload)| {
                    mutated(codec::encode(&WsBinaryRequest { id, event_type, payload }).unwrap())
                }),
        ]
    ) {
        let _ = bounded(&bytes, codec::decode::<WsBinaryRequest>);
    }

    #[test]
    fn patterns_never_panic(pattern in ".{0,40}") {
        let _ = pattern_prefix(&pattern);
    }

    #[test]
    fn filters_never_panic(filter in json(), body in json(), text in ".{0,64}") {
        if let Ok(f) = Filter::parse(&filter) {
            let _ = f.matches(&body);
            // What parses round-trips through its text, as subscriptions travel.
            prop_assert!(Filter::parse_str(&filter.to_string()).is_ok());
        }
        let _ = bounded(text.as_bytes(), |_| Filter::parse_str(&text));
    }
}

proptest! {
    #![proptest_config(config(64))]

    /// The reader over a real socket, fed arbitrary bytes in arbitrary
    /// pieces: it ends with a frame, an error or the end, never a panic or
    /// a hang.
    #[test]
    fn the_frame_reader_survives_any_byte_stream(
        pieces in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..512), 0..16),
        valid in prop::option::of(envelope()),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            use tokio::io::AsyncWriteExt;
            let (mut a, b) = tokio::net::UnixStream::pair().unwrap();
            let mut reader = switchyard_proto::transport::FrameReader::new(b, 64 * 1024);
            let writer = async move {
                if let Some(env) = valid {
                    let _ = a.write_all(&frame::encode(&env, DEFAULT_MAX_FRAME).unwrap()).await;
                }
                for piece in pieces {
                    if a.write_all(&piece).await.is_err() {
                        break;
                    }
                }
            };
            let read = async {
                let mut out = Vec::new();
                while let Ok(true) = reader.read_batch(&mut out).await {
                    out.clear();
                }
            };
            let limit = std::time::Duration::from_secs(10);
            tokio::time::timeout(limit, async { tokio::join!(writer, read) })
                .await
                .expect("the reader ends once the writer is gone");
        });
    }
}
