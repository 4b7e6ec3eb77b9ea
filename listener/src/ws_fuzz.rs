//! Property tests of what `/ws` makes of a client's messages (decision 0099):
//! arbitrary text and bytes, and JSON messages built from the protocol's
//! own keys with arbitrary values, go through the same decoding and
//! checks as the session loop (JSON object, binary request, subscription
//! pattern and filter, the error answer echoing the client's `id`). No
//! input panics; every answer is one JSON object that carries the
//! client's `id` back unchanged.

use proptest::prelude::*;
use serde_json::Value;
use switchyard_proto::control::WsBinaryRequest;
use tokio_tungstenite::tungstenite::Message;

use super::error_message;
use crate::pipes::check_subscription;

fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        // Floats that survive a JSON round trip: serde_json without
        // `float_roundtrip` may move others by an ulp, id echo included.
        (-1_000_000i64..1_000_000).prop_map(|n| Value::from(n as f64 / 8.0)),
        "(demo\\.[a-z]{0,6}|[a-z.*]{0,8}|eq|ne|in|gt|lt|\\PC{0,8})".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("(eq|ne|in|gt|gte|lt|lte|n|[a-z]{0,4})", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A message shaped like the protocol's: some of its keys, any values.
fn message() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(
        "(id|type|data|subscribe|unsubscribe|notify|filter|[a-z]{1,6})",
        json(),
        0..5,
    )
    .prop_map(|m| Value::Object(m.into_iter().collect()))
}

/// What the session loop decides for one text message, without a group
/// behind it: the answer it would give on the spot, if any.
fn decide(text: &str) -> Option<Message> {
    let Ok(Value::Object(m)) = serde_json::from_str::<Value>(text) else {
        return Some(error_message(None, 400, "a message is one JSON object"));
    };
    let id = m.get("id");
    if let Some(pattern) = m.get("subscribe") {
        let Value::String(pattern) = pattern else {
            return Some(error_message(id, 400, "`subscribe` takes a pattern string"));
        };
        return match check_subscription(pattern, m.get("filter")) {
            Ok(filter_json) => {
                // What is accepted travels as text and must parse again.
                if !filter_json.is_empty() {
                    assert!(switchyard_proto::control::Filter::parse_str(&filter_json).is_ok());
                }
                None
            }
            Err(reason) => Some(error_message(id, 400, &reason)),
        };
    }
    if m.get("unsubscribe").is_some() || m.get("notify").is_some() || m.get("type").is_some() {
        return None;
    }
    Some(error_message(
        id,
        400,
        "a message has `type`, `subscribe`, `unsubscribe` or `notify`",
    ))
}

fn check_answer(answer: Option<Message>, sent_id: Option<&Value>) {
    let Some(answer) = answer else { return };
    let Message::Text(text) = answer else {
        panic!("an answer is a text message");
    };
    let Ok(Value::Object(out)) = serde_json::from_str::<Value>(text.as_str()) else {
        panic!("an answer is one JSON object: {text}");
    };
    assert_eq!(out.get("id"), sent_id, "the client's id comes back unchanged");
    assert!(out.get("status").and_then(Value::as_u64).is_some());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn protocol_shaped_messages_never_panic(m in message()) {
        let text = m.to_string();
        let id = serde_json::from_str::<Value>(&text).ok().and_then(|v| v.get("id").cloned());
        check_answer(decide(&text), id.as_ref());
    }

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,256}") {
        let answer = decide(&text);
        let id = serde_json::from_str::<Value>(&text).ok().and_then(|v| v.get("id").cloned());
        check_answer(answer, id.as_ref());
    }

    #[test]
    fn arbitrary_binary_messages_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..1024)) {
        let _ = switchyard_proto::codec::decode::<WsBinaryRequest>(&bytes);
    }
}
