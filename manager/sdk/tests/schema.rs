//! The derives describe their types: fields as serde names them, doc
//! comments, validation rules, header and cookie parameters, replies.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use switchyard_manager::schema::{self, ViaAny as _, ViaJsonSchema as _};
use switchyard_manager::{Event, JsonSchema, Reply};

/// A line item.
#[derive(Serialize, Deserialize, JsonSchema)]
pub struct Line {
    pub sku: String,
    pub qty: u32,
}

/// Places an order.
///
/// Second paragraph.
#[derive(Serialize, Deserialize, Event)]
#[event(name = "shop.Order", http = "POST /orders/{shop_id}")]
#[serde(rename_all = "camelCase")]
pub struct Order {
    /// The shop.
    #[validate(range(min = 1, max = 99))]
    pub shop_id: u64,
    /// What is bought.
    #[validate(length(min = 1, max = 10))]
    pub lines: Vec<Line>,
    #[validate(length(max = 200))]
    pub note: Option<String>,
    #[serde(default)]
    pub gift: bool,
    #[serde(skip)]
    pub internal: u8,
    #[from(header = "X-Api-Key")]
    pub api_key: String,
    #[from(cookie = "session")]
    pub session: Option<String>,
    #[from(scope = "sub")]
    pub sub: Option<String>,
}

/// The order as placed.
#[derive(Serialize, Reply)]
#[reply(status = 201)]
pub struct Placed {
    /// Its number.
    pub id: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eta: Option<String>,
}

fn value(s: schema::Schema) -> Value {
    s.to_value()
}

#[test]
fn an_event_schema_has_its_fields_docs_and_rules() {
    let mut generator = schema::generator();
    let described = Order::schema(&mut generator);
    assert_eq!(described.description, "Places an order.\n\nSecond paragraph.");
    let s = value(schema::standalone(described.schema, &mut generator));
    let props = &s["properties"];
    assert_eq!(props["shopId"]["description"], "The shop.");
    assert_eq!(props["shopId"]["minimum"], 1);
    assert_eq!(props["shopId"]["maximum"], 99);
    assert_eq!(props["lines"]["type"], "array");
    assert_eq!(props["lines"]["minItems"], 1);
    assert_eq!(props["lines"]["maxItems"], 10);
    assert_eq!(props["note"]["maxLength"], 200);
    assert!(props.get("internal").is_none(), "skipped");
    assert!(props.get("apiKey").is_none(), "bound to a header");
    assert!(props.get("sub").is_none(), "bound to the scope");
    assert_eq!(s["required"], json!(["shopId", "lines"]));
    assert!(s["$defs"]["Line"].is_object(), "{s}");
    assert_eq!(described.params.len(), 2);
    assert_eq!(described.params[0].location, "header");
    assert_eq!(described.params[0].name, "x-api-key");
    assert!(described.params[0].required);
    assert_eq!(described.params[1].location, "cookie");
    assert!(!described.params[1].required);
}

#[test]
fn a_reply_schema_has_its_status_and_fields() {
    let reply = Placed::describe(&mut schema::generator()).expect("described");
    assert_eq!(reply.status, 201);
    assert_eq!(reply.description, "The order as placed.");
    let s: Value = serde_json::from_str(&reply.schema).unwrap();
    assert_eq!(s["properties"]["id"]["description"], "Its number.");
    assert_eq!(s["required"], json!(["id"]));
}

#[test]
fn created_is_described_with_its_bodys_schema_and_no_content_as_204() {
    let created =
        switchyard_manager::Created::<Placed>::describe(&mut schema::generator()).expect("described");
    assert_eq!(created.status, 201);
    assert_eq!(created.content_type, "application/json");
    let s: Value = serde_json::from_str(&created.schema).unwrap();
    assert_eq!(s["properties"]["id"]["type"], "integer", "{s}");
    assert_eq!(s["required"], json!(["id"]));

    let none = switchyard_manager::NoContent::describe(&mut schema::generator()).expect("described");
    assert_eq!(
        (none.status, none.content_type.as_str(), none.schema.as_str()),
        (204, "", "")
    );
    let r = switchyard_manager::NoContent
        .into_response(switchyard_manager::Format::Json)
        .unwrap();
    assert_eq!((r.status, r.body.len()), (204, 0));
}

struct Opaque;

#[test]
#[allow(clippy::needless_borrow)]
fn a_field_type_without_a_schema_is_any_value() {
    let mut g = schema::generator();
    assert_eq!(
        value((&&schema::Probe::<Opaque>::new()).schema_of(&mut g)),
        json!({})
    );
    assert_eq!(
        value((&&schema::Probe::<u8>::new()).schema_of(&mut g))["type"],
        "integer"
    );
}

/// A page of orders: a reply whose field is a list of another reply.
#[derive(Serialize, Reply)]
pub struct Orders {
    pub orders: Vec<Placed>,
    pub first: Option<Placed>,
}

#[test]
fn a_reply_nested_in_another_is_described_by_its_fields() {
    // `Placed` derives only `Reply`: it is its own `JsonSchema` too, so
    // the list's items carry their integer id (the typed gRPC service
    // then a varint) instead of any value.
    let reply = Orders::describe(&mut schema::generator()).expect("described");
    let s: Value = serde_json::from_str(&reply.schema).unwrap();
    let items = &s["properties"]["orders"]["items"];
    let reference = items["$ref"].as_str().unwrap_or_else(|| panic!("{s}"));
    let name = reference.rsplit('/').next().unwrap();
    let placed = &s["$defs"][name];
    assert_eq!(placed["properties"]["id"]["type"], "integer", "{s}");
    assert_eq!(placed["properties"]["id"]["description"], "Its number.", "{s}");
    assert_eq!(placed["required"], json!(["id"]), "{s}");
    // The top level stays inline, not a `$ref` to itself.
    assert_eq!(s["type"], "object", "{s}");
    assert!(s["properties"]["first"].is_object(), "{s}");
}
