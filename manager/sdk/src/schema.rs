//! JSON Schemas of event and reply types, for the API description
//! (`/openapi.json`, `/docs`, typed gRPC: docs/api.md).
//!
//! `#[derive(Event)]` and `#[derive(Reply)]` build a type's schema from its
//! fields as serde names them, with its doc comments as descriptions and
//! its `#[validate(...)]` rules as keywords (`minLength`, `maximum`, …).
//! A field's own schema comes from [`schemars`] when its type implements
//! [`JsonSchema`] (every std type does; derive it on your own nested
//! types), and is "any value" otherwise, so an event never fails to
//! compile for want of one. Schemas are made only when the validation
//! child asks (decision 0060), never on a request's path.

use std::marker::PhantomData;

pub use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{Map, Value};
pub use switchyard_proto::api::{BoundParam, ReplyDoc};

/// A fresh generator: JSON Schema 2020-12, definitions under `$defs`.
pub fn generator() -> SchemaGenerator {
    schemars::generate::SchemaSettings::draft2020_12().into_generator()
}

/// `schema` with `generator`'s definitions moved into its `$defs`, so
/// that it stands alone.
pub fn standalone(mut schema: Schema, generator: &mut SchemaGenerator) -> Schema {
    let defs = generator.take_definitions(true);
    if !defs.is_empty()
        && let Some(object) = schema.as_object_mut()
    {
        object.insert("$defs".to_owned(), Value::Object(defs));
    }
    schema
}

/// What `#[derive(Event)]` says of its type.
pub struct EventSchema {
    pub description: String,
    pub schema: Schema,
    pub whole_body: bool,
    pub params: Vec<BoundParam>,
}

impl EventSchema {
    /// A type that says nothing of itself: any JSON value.
    pub fn any() -> EventSchema {
        EventSchema {
            description: String::new(),
            schema: Schema::default(),
            whole_body: false,
            params: Vec::new(),
        }
    }

    /// A type described by its own [`JsonSchema`] (its doc comment is the
    /// description): the built-ins' events, which are not derived.
    pub fn of<T: JsonSchema>(generator: &mut SchemaGenerator) -> EventSchema {
        let schema = T::json_schema(generator);
        let description = schema
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        EventSchema {
            description,
            schema,
            whole_body: false,
            params: Vec::new(),
        }
    }
}

/// What a [`Reply`](crate::Reply) says of its body.
pub fn reply(status: u16, description: &str, schema: Option<Schema>) -> ReplyDoc {
    ReplyDoc {
        status,
        content_type: if status == 204 {
            String::new()
        } else {
            crate::JSON.to_owned()
        },
        description: description.to_owned(),
        schema: schema.map(|s| s.as_value().to_string()).unwrap_or_default(),
    }
}

/// An object schema built field by field (what the derives expand to).
pub struct Object {
    properties: Map<String, Value>,
    required: Vec<Value>,
    description: String,
    open: bool,
}

impl Object {
    pub fn new(description: &str) -> Object {
        Object {
            properties: Map::new(),
            required: Vec::new(),
            description: description.to_owned(),
            open: false,
        }
    }

    /// Adds field `key` with its schema, doc comment and rules.
    pub fn field(&mut self, key: &str, description: &str, schema: Schema, required: bool, rules: &[Rule]) {
        let mut value = schema.to_value();
        if !value.is_object() {
            // `true` (any value): an object to hang keywords on.
            value = Value::Object(Map::new());
        }
        let object = value.as_object_mut().expect("made an object above");
        if !description.is_empty() {
            object.insert("description".to_owned(), Value::String(description.to_owned()));
        }
        let array = match object.get("type") {
            Some(Value::String(t)) => t == "array",
            Some(Value::Array(ts)) => ts.iter().any(|t| t == "array"),
            _ => false,
        };
        for rule in rules {
            let (low, high, min, max) = match rule {
                Rule::Length(min, max) if array => ("minItems", "maxItems", min, max),
                Rule::Length(min, max) => ("minLength", "maxLength", min, max),
                Rule::Range(min, max) => ("minimum", "maximum", min, max),
            };
            if let Some(min) = min {
                object.insert(low.to_owned(), min.clone());
            }
            if let Some(max) = max {
                object.insert(high.to_owned(), max.clone());
            }
        }
        if required {
            self.required.push(Value::String(key.to_owned()));
        }
        self.properties.insert(key.to_owned(), value);
    }

    /// A flattened field: other properties are allowed.
    pub fn open(&mut self) {
        self.open = true;
    }

    pub fn into_schema(self) -> Schema {
        let mut object = Map::new();
        object.insert("type".to_owned(), "object".into());
        if !self.description.is_empty() {
            object.insert("description".to_owned(), Value::String(self.description));
        }
        object.insert("properties".to_owned(), Value::Object(self.properties));
        if !self.required.is_empty() {
            object.insert("required".to_owned(), Value::Array(self.required));
        }
        if self.open {
            object.insert("additionalProperties".to_owned(), true.into());
        }
        Schema::from(object)
    }
}

/// A `#[validate(...)]` rule, as schema keywords.
pub enum Rule {
    /// `length(min, max)` / `non_empty`: of a string, or items of an array.
    Length(Option<Value>, Option<Value>),
    /// `range(min, max)`.
    Range(Option<Value>, Option<Value>),
}

/// A bound of a rule as JSON (its expression's value).
pub fn bound<T: serde::Serialize>(value: T) -> Option<Value> {
    serde_json::to_value(value).ok()
}

/// Picks a field type's schema: [`JsonSchema`]'s when the type has one,
/// else "any value" (autoref specialisation: the derives call
/// `(&&Probe::<T>::new()).schema_of(generator)` with both traits in scope).
pub struct Probe<T: ?Sized>(PhantomData<T>);

impl<T: ?Sized> Probe<T> {
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Probe(PhantomData)
    }
}

/// The preferred pick: the type's own schema.
pub trait ViaJsonSchema {
    fn schema_of(&self, generator: &mut SchemaGenerator) -> Schema;
}

impl<T: JsonSchema + ?Sized> ViaJsonSchema for &Probe<T> {
    fn schema_of(&self, generator: &mut SchemaGenerator) -> Schema {
        generator.subschema_for::<T>()
    }
}

/// The fallback: any value.
pub trait ViaAny {
    fn schema_of(&self, generator: &mut SchemaGenerator) -> Schema;
}

impl<T: ?Sized> ViaAny for Probe<T> {
    fn schema_of(&self, _: &mut SchemaGenerator) -> Schema {
        Schema::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Opaque;

    #[test]
    #[allow(clippy::needless_borrow)]
    fn a_type_without_json_schema_is_any_value() {
        let mut g = generator();
        let known = (&&Probe::<u32>::new()).schema_of(&mut g);
        assert_eq!(known.get("type"), Some(&Value::from("integer")));
        let opaque = (&&Probe::<Opaque>::new()).schema_of(&mut g);
        assert_eq!(opaque, Schema::default());
    }
}
